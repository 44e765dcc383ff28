// The FFN executor of a sparsity plan: each layer in its own mode (sparsity_mode.h), each
// token through NeuronFfn (dense layers through DenseFfn's GEMMs), with counts of the neurons
// that ran for reports.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/runtime/ffn.h"
#include "shared/sparsity/neuron_bundle.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

struct SparseFfnOptions {
  // Element type of the transposed down copies of a Q8_0/Q4_0 model (see DownRows): nullopt
  // keeps the model's type (lossy requantization, same bytes per neuron); kF16 is exact.
  std::optional<GgmlType> quantized_down_t_type;
  // Copy each sparse layer's neuron rows side by side (NeuronBundle: [gate | up | down] per
  // neuron under predicted, [up | down] under exact and threshold), and drop the separate
  // transposed down copy. Costs the bundled rows' memory once more than the model file (whose
  // pages, no longer read, stay reclaimable), and buys a faster gather (docs/performance.md,
  // "Neuron bundles"). Off with THERMOCLINE_NEURON_BUNDLES=0.
  bool neuron_bundles = NeuronBundle::WantedFromEnvironment();
};

// What one layer did since the last reset.
struct LayerActivity {
  int64_t tokens = 0;
  int64_t candidates = 0;  // gate rows computed (every neuron, or the predicted ones)
  int64_t active = 0;      // neurons whose up rows ran
  int64_t down = 0;        // of those, neurons whose down rows ran (fewer under a coefficient cut)
  int64_t predictor_bytes = 0;  // predictor weights read (predicted layers)
};

class SparseFfn final : public FfnExecutor {
 public:
  // Validates the plan against the model and builds the transposed down rows of every
  // non-dense layer whose model has none (see DownRows for the memory this costs).
  static absl::StatusOr<std::unique_ptr<SparseFfn>> Create(const Model& model,
                                                           SparsityPlan plan, ThreadPool& pool,
                                                           const SparseFfnOptions& options = {});

  // Exact and threshold layers first compute the gate of every neuron for the whole batch in
  // one MatMul (bit-identical per token). One token then runs through NeuronFfn with the pool
  // splitting its neurons; several tokens are split over the pool's threads instead, each
  // running its tokens alone: one parallel region per layer rather than a few per token.
  using FfnExecutor::Compute;
  void Compute(int64_t layer, const float* h, const float* predictor_input, int64_t n_tokens,
               float* out) override;

  const SparsityPlan& plan() const { return plan_; }
  const std::vector<LayerActivity>& activity() const { return activity_; }
  void ResetActivity();
  // active / (tokens * ffn_dim) of one layer, and over all layers; 0 before any token.
  double ActiveRatio(int64_t layer) const;
  double ActiveRatio() const;
  // down / (tokens * ffn_dim) over all layers: the share of down rows read.
  double DownRatio() const;
  // FFN weight bytes read per token on average over the recorded activity (gate rows of the
  // candidates, up rows of the active neurons, down rows of those that passed the coefficient
  // cut, predictor weights), for floors.
  double FfnBytesPerToken() const;
  // Memory held by transposed down copies (outside the bundles), and by neuron bundles.
  int64_t down_t_bytes() const;
  int64_t bundle_bytes() const;
  const NeuronWeights& weights(int64_t layer) const { return weights_[layer]; }

 private:
  SparseFfn(const Model& model, SparsityPlan plan, ThreadPool& pool);

  const Model& model_;
  SparsityPlan plan_;
  ThreadPool& pool_;
  DenseFfn dense_;
  std::vector<DownRows> down_rows_;     // [n_layers]; empty view for dense layers
  std::vector<NeuronBundle> bundles_;   // [n_layers]; empty for dense and MoE layers
  std::vector<NeuronWeights> weights_;  // [n_layers]
  std::vector<LayerActivity> activity_;
  // Per pool thread: a single-threaded pool for its kernels, its scratch and predicted ids, and
  // its counts until they are added to activity_. Index 0 also serves single-token calls.
  struct Worker {
    std::unique_ptr<ThreadPool> solo;
    NeuronFfn neurons;
    std::vector<int32_t> predicted;
    int64_t candidates = 0, active = 0, down = 0, predictor_bytes = 0;
  };
  void RunToken(Worker& worker, ThreadPool& pool, int64_t layer, const float* h,
                const float* predictor_input, const float* gate, float* out);

  std::vector<Worker> workers_;
  // MoE layers (exact, threshold): every expert, and the shared expert, as neuron-major
  // weights; routing as the dense pass (RouteExperts), then NeuronFfn inside each chosen expert
  // with that expert's filter (its own cuts under threshold).
  struct MoeLayer {
    std::vector<NeuronWeights> experts;
    std::vector<DownRows> downs;
    NeuronWeights shared;
    DownRows shared_down;
  };
  void ComputeMoe(int64_t layer, const float* h, int64_t n_tokens, float* out);
  std::vector<MoeLayer> moe_;  // [n_layers]; empty entries for other layers
  std::vector<float> moe_probs_, moe_weights_, moe_y_;
  std::vector<int32_t> moe_picks_, shared_ids_;
  std::vector<int32_t> all_ids_;   // 0..max(ffn_dim, shared expert width)-1
  std::vector<float> batch_gate_;  // [n_tokens][ffn_dim] gate pre-activations
};

}  // namespace thermocline
