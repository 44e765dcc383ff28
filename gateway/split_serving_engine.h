// The split engine (shared/driver/split_engine.h) as the scheduler's ServingEngine: the two
// worker processes' pids and restart counts come from the engine's supervisor and stats.
#pragma once

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "gateway/serving_engine.h"
#include "shared/driver/split_engine.h"

namespace thermocline::gateway {

class SplitServingEngine final : public ServingEngine {
 public:
  explicit SplitServingEngine(std::unique_ptr<driver::SplitEngine> engine)
      : engine_(std::move(engine)) {}

  absl::Status Run(std::span<const BatchEntry> batch, std::vector<float>& logits) override {
    return engine_->Run(batch, logits);
  }
  int64_t vocab_size() const override { return engine_->vocab_size(); }
  int64_t context() const override { return engine_->context(); }
  // The engine's ResetSlot releases the slot's history (never replayed after a restart).
  void ResetSlot(int32_t slot) override { engine_->ResetSlot(slot); }
  int32_t ReusePrefix(int32_t slot, std::span<const int32_t> tokens) override {
    return engine_->ReusePrefix(slot, tokens);
  }
  absl::Status ForkSlot(int32_t src, int32_t dst, int32_t n) override {
    return engine_->ForkSlot(src, dst, n);
  }
  PrefixCacheStats prefix_cache_stats() const override { return engine_->prefix_cache_stats(); }
  WorkerHealth health() const override {
    const driver::SplitEngineStats& st = engine_->stats();
    return {engine_->worker_pid(ipc::Role::kGpuWorker), engine_->worker_pid(ipc::Role::kCpuWorker),
            st.gpu_restarts, st.cpu_restarts};
  }

 private:
  std::unique_ptr<driver::SplitEngine> engine_;
};

}  // namespace thermocline::gateway
