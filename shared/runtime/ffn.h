// The FFN block of one layer behind an interface: the dense pass computes every neuron; the
// sparse executors (sparsity/) and the split workers (hot on the GPU side, cold on the CPU side)
// plug in here without touching attention.
#pragma once

#include <cstdint>
#include <vector>

#include "shared/model/model.h"
#include "shared/runtime/linear.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

class FfnExecutor {
 public:
  virtual ~FfnExecutor() = default;
  // out[t][0..dim) = FFN_layer(h[t]) for t < n_tokens; h is the FFN's input (ffn_norm(x), or
  // the shared norm of a parallel block). predictor_input[t] is what the layer's activation
  // predictors read: the tensor PowerInfer's own graph feeds them (arch.h PredictorInput).
  virtual void Compute(int64_t layer, const float* h, const float* predictor_input,
                       int64_t n_tokens, float* out) = 0;
  // For callers that drive one FFN on its own (tests, tools): the predictors read h.
  void Compute(int64_t layer, const float* h, int64_t n_tokens, float* out) {
    Compute(layer, h, h, n_tokens, out);
  }
};

// Sees what the dense FFN computes, for the offline tools (profiler, predictor trainer).
class FfnObserver {
 public:
  virtual ~FfnObserver() = default;
  // h: [n_tokens][dim] FFN inputs; gate, up: [n_tokens][ffn_dim] gate pre-activations (before
  // the activation) and up projections. In FFNs without a gate (plain MLPs), `gate` is the up
  // projection plus its bias (what the activation reads) and `up` is null. Called from the
  // thread that runs the forward pass; not called for MoE layers.
  virtual void OnFfn(int64_t layer, const float* h, const float* gate, const float* up,
                     int64_t n_tokens) = 0;
  // MoE layers: one call per expert that some token picked, over the n_rows (token, pick) rows
  // the router sent to it, in token order: gate and up are [n_rows][ffn_dim] as in OnFfn (up is
  // null for experts without a gate). The shared expert is not reported.
  virtual void OnExpertFfn(int64_t /*layer*/, int64_t /*expert*/, const float* /*gate*/,
                           const float* /*up*/, int64_t /*n_rows*/) {}
  // Called just before OnFfn with the same layer's predictor input (see FfnExecutor::Compute).
  virtual void OnPredictorInput(int64_t /*layer*/, const float* /*x*/, int64_t /*n_tokens*/) {}
};

// Every neuron, every token: gate and up as GEMMs, the activation, then down; in MoE layers the
// router's top-k experts per token (each expert's tokens in one GEMM) and the shared expert.
class DenseFfn final : public FfnExecutor {
 public:
  DenseFfn(const Model& model, ThreadPool& pool) : model_(model), pool_(pool) {}
  using FfnExecutor::Compute;
  void Compute(int64_t layer, const float* h, const float* predictor_input, int64_t n_tokens,
               float* out) override;
  void set_observer(FfnObserver* observer) { observer_ = observer; }
  // Computes gate, up and down of the dense (non-MoE) layers through `linear` (null: MatMul).
  void set_linear(LinearExecutor* linear) { linear_ = linear; }

 private:
  // One FFN (dense or one expert) over n rows of h into out ([n][dim]); expert >= 0 reports
  // the expert's gate and up to the observer.
  void RunFfn(const FfnWeights& w, const std::vector<float>& up_b, int64_t nf, const float* h,
              int64_t n, float* out, int64_t layer = -1, int64_t expert = -1);
  void ComputeMoe(int64_t layer, const float* h, int64_t n_tokens, float* out);
  // One product of the dense-layer path: through linear_ when set (TEAL), else the plain
  // kernels (MatMul; for a transposed down, AxpyRows over every row) exactly as without it.
  void Product(int64_t layer, Projection p, const MatrixView& w, bool transposed, const float* in,
               int64_t n_tokens, int64_t n_in, float* out, int64_t n_out);

  const Model& model_;
  ThreadPool& pool_;
  FfnObserver* observer_ = nullptr;
  LinearExecutor* linear_ = nullptr;
  std::vector<float> gate_, up_;
  std::vector<int32_t> all_rows_;  // 0..ffn_dim-1, for the transposed-down (axpy) form
  // MoE scratch: router probabilities, picks, gathered rows and per-pick outputs.
  std::vector<float> probs_, moe_h_, moe_y_, picks_y_, shared_y_;
  std::vector<int32_t> picks_;
  std::vector<float> pick_w_;
  std::vector<int64_t> moe_rows_;
};

// The experts each token of an MoE layer uses, as llama.cpp routes: softmax over the router's
// logits, the n_experts_used largest (lower id first on ties), their probabilities as weights,
// renormalised to sum 1 where the architecture does. picks/weights: [n_tokens][n_experts_used];
// probs is scratch. Shared by the dense and the sparse FFN so both route alike.
void RouteExperts(const ModelConfig& config, const LayerWeights& w, const float* h,
                  int64_t n_tokens, ThreadPool& pool, std::vector<float>& probs,
                  std::vector<int32_t>& picks, std::vector<float>& weights);

// y[r][i] += b[i] for r < n_rows, i < b.size() (rows of b.size() values); nothing for an empty b
// (an absent bias).
void AddRowBias(const std::vector<float>& b, int64_t n_rows, float* y);

// sigmoid(shared_gate . h): the weight of a layer's shared expert for one token (qwen2moe).
float SharedExpertGate(const LayerWeights& w, const float* h);

// The activation of n values (tokens x neurons, contiguous) in place in gate, gated by up unless
// it is null; the same bits whatever the pool (the dense FFN's step, shared with TEAL's split FFN).
void ActivateValues(FfnActivation activation, float* gate, const float* up, int64_t n,
                    ThreadPool& pool);

// act(x) in place for the activation of a plain (non-gated) MLP.
void Activate(FfnActivation activation, float* x, int64_t n);
// gate[i] = act(gate[i]) * up[i] for the gated forms (dReLU: relu(gate) * relu(up)).
void GatedActivate(FfnActivation activation, float* gate, const float* up, int64_t n);

}  // namespace thermocline
