// The FFN block of one layer behind an interface: the dense pass computes every neuron; the
// sparse executors (sparsity/) and the split workers (hot on the GPU side, cold on the CPU side)
// plug in here without touching attention.
#pragma once

#include <cstdint>
#include <vector>

#include "shared/model/llama_model.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

class FfnExecutor {
 public:
  virtual ~FfnExecutor() = default;
  // out[t][0..dim) = FFN_layer(h[t]) for t < n_tokens; h is the ffn_norm output.
  virtual void Compute(int64_t layer, const float* h, int64_t n_tokens, float* out) = 0;
};

// Sees what the dense FFN computes, for the offline tools (profiler, predictor trainer).
class FfnObserver {
 public:
  virtual ~FfnObserver() = default;
  // h: [n_tokens][dim] FFN inputs; gate, up: [n_tokens][ffn_dim] gate pre-activations (before
  // silu/relu) and up projections. Called from the thread that runs the forward pass.
  virtual void OnFfn(int64_t layer, const float* h, const float* gate, const float* up,
                     int64_t n_tokens) = 0;
};

// Every neuron, every token: gate and up as GEMMs, the activation, then down.
class DenseFfn final : public FfnExecutor {
 public:
  DenseFfn(const LlamaModel& model, ThreadPool& pool) : model_(model), pool_(pool) {}
  void Compute(int64_t layer, const float* h, int64_t n_tokens, float* out) override;
  void set_observer(FfnObserver* observer) { observer_ = observer; }

 private:
  const LlamaModel& model_;
  ThreadPool& pool_;
  FfnObserver* observer_ = nullptr;
  std::vector<float> gate_, up_;
  std::vector<int32_t> all_rows_;  // 0..ffn_dim-1, for the transposed-down (axpy) form
};

}  // namespace thermocline
