// The `host` backend: the GPU worker's interface on CPU threads, for machines without a GPU and
// for tests. ForwardPass runs attention and the rest of the model; its FfnExecutor is the
// split FFN, which exchanges each layer's cold half with the CPU worker through the ColdLink.
// It maps the whole model file (it is a test and fallback backend); only the hot neurons'
// FFN rows are ever computed here.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/host/split_ffn.h"
#include "shared/gguf/ggml_type.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/teal.h"
#include "shared/util/thread_pool.h"

namespace thermocline::gpu_worker {

struct HostBackendOptions {
  int threads = 1;
  int32_t n_kv_slots = 4;
  int32_t context = 0;  // 0: the model's context length
  int32_t max_batch = 512;
  GgmlType kv_type = GgmlType::kF32;
  // Blocks beyond the slots' own for the prefix cache (0: no paging, the contiguous cache).
  int32_t prefix_cache_blocks = 0;
  // TEAL on attention; with plan.ffn (calibrated cuts, the dense FFN mode) on the split FFN too.
  std::optional<TealPlan> teal;
};

class HostBackend final : public Backend {
 public:
  // `model` must outlive the backend.
  static absl::StatusOr<std::unique_ptr<HostBackend>> Create(const Model& model,
                                                             SparsityPlan plan,
                                                             Partition partition,
                                                             const HostBackendOptions& options);

  std::string_view name() const override { return "host"; }
  const BackendLimits& limits() const override { return limits_; }
  // The host backend computes synchronously: StartStep records the batch, FinishStep runs it.
  absl::Status StartStep(std::span<const BatchEntry> batch, ColdLink& cold) override;
  absl::Status FinishStep(std::vector<float>* logits) override;
  absl::Status MapKv(std::span<const KvSlotTable> tables,
                     std::span<const KvBlockCopy> copies) override {
    return kv_.Apply(tables, copies);
  }
  void SetMetrics(ipc::WorkerMetricsWriter* metrics) override { ffn_->SetMetrics(metrics); }

 private:
  HostBackend(const Model& model, KvCache kv, int threads);

  const Model& model_;
  KvCache kv_;
  ThreadPool pool_;
  std::unique_ptr<SplitFfn> ffn_;
  std::unique_ptr<TealLinear> teal_;  // before pass_, which uses it
  std::unique_ptr<ForwardPass> pass_;
  BackendLimits limits_;
  std::vector<BatchEntry> batch_;
  std::vector<uint8_t> decode_;  // DecodeRows of batch_, for the split FFN's TEAL
  ColdLink* cold_ = nullptr;
};

}  // namespace thermocline::gpu_worker
