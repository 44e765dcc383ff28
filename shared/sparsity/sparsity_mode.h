// Which FFN neurons run, per layer (see DESIGN.md, "Sparsity modes"):
//   dense      every neuron, as DenseFfn computes it;
//   exact      ReLU family: the gate for every neuron, then up and down only where the
//              activation is > 0 (the other products are exactly zero, so nothing is lost);
//   threshold  two calibrated per-layer cuts from `thermocline profile`: the down row of neuron i
//              is skipped when its coefficient |act(gate_i . h) * (up_i . h)| is under the
//              coefficient cut of the target sparsity (TEAL's criterion for the down input),
//              and its up row too when |act(gate_i . h)| is under the gate cut of the (lower)
//              gate sparsity (CATS's criterion; the gate is computed for every neuron);
//   predicted  the layer's predictor picks the candidate neurons before any FFN work; among
//              them, ReLU models still skip those whose activation is 0, and SiLU models those
//              under the layer's cut when one is set.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/predictor.h"

namespace thermocline {

enum class SparsityMode { kDense, kExact, kThreshold, kPredicted };

// "dense", "exact", "threshold", "predicted".
std::string_view SparsityModeName(SparsityMode mode);
std::optional<SparsityMode> ParseSparsityMode(std::string_view name);
// An error listing the valid names when `name` is not one of them.
absl::StatusOr<SparsityMode> ParseSparsityModeOrError(std::string_view name);

// A mode per layer, plus what the modes need: a magnitude cut per layer (threshold, and
// predicted on SiLU models) and the predictors (predicted).
struct SparsityPlan {
  std::vector<SparsityMode> modes;  // [n_layers]
  std::vector<float> cuts;          // [n_layers]; |act(gate)| cut, 0 = no cut
  std::vector<float> coeff_cuts;    // [n_layers]; |act(gate) * up| cut, 0 = no cut
  // Threshold in mixture-of-experts layers: each expert's own cuts, [n_layers][n_experts]
  // (empty for the other layers; both vectors empty when the model has no MoE threshold layer).
  // The layer-level cuts of such a layer stay 0, and its shared expert runs every neuron.
  std::vector<std::vector<float>> expert_cuts, expert_coeff_cuts;
  std::shared_ptr<const PredictorSet> predictors;

  // The same mode for every layer, no cuts, no predictors.
  static SparsityPlan Uniform(SparsityMode mode, int64_t n_layers);

  // One mode for every layer of `model`, with what it needs: `stats` and `target_sparsity`
  // (threshold: each layer's coefficient cut for that target, and its gate cut for
  // `gate_sparsity` when given; predicted on a SiLU model: the gate cut for the target,
  // optional), `predictors` (predicted). Then Validate.
  static absl::StatusOr<SparsityPlan> ForModel(const ModelConfig& config, SparsityMode mode,
                                               const ActivationStats* stats,
                                               std::optional<float> target_sparsity,
                                               std::shared_ptr<const PredictorSet> predictors,
                                               std::optional<float> gate_sparsity = std::nullopt);

  SparsityMode mode(int64_t layer) const { return modes[layer]; }
  // Which of a layer's candidates run (NeuronFfn's filter), for every executor of the plan:
  // the single-process SparseFfn and both halves of a split (hot and cold neurons are filtered
  // alike, so the split computes the same neurons as one process). None for dense layers.
  // In MoE layers, `expert` names the routed expert (its own cuts under threshold).
  NeuronFilter FilterFor(int64_t layer, FfnActivation activation, int64_t expert = -1) const;
  // The filter of an MoE layer's shared expert: exact as FilterFor; threshold keeps every neuron
  // (the profile calibrates the routed experts only).
  NeuronFilter SharedExpertFilter(int64_t layer, FfnActivation activation) const;
  bool AllDense() const;

  // Checks the plan against the model: one entry per layer, exact only on ReLU models, a
  // positive finite cut for every threshold layer (every expert's in MoE layers), predictors for
  // every predicted layer (with the model's shapes; not in MoE layers). Errors name the layer
  // (and expert) and what is missing.
  absl::Status Validate(const ModelConfig& config) const;
};

// The command-line face of a plan, shared by `generate`, `perplexity`, the benchmarks and the
// workers: --sparsity MODE [--stats S.gguf --target-sparsity T] [--predictor P.gguf].
// The measured sweet spot on stories260K (docs/sparsity.md): a gate cut at 20% costs almost
// nothing and saves a fifth of the up rows; higher gate cuts cost more perplexity than the
// coefficient cut does for the same rows.
inline constexpr float kDefaultGateSparsity = 0.2f;

struct SparsityFlags {
  std::string mode = "dense";
  std::string stats_path;                // activation statistics from `thermocline profile`
  std::optional<float> target_sparsity;  // picks the cuts in the statistics
  // threshold: the share of up rows skipped by the gate cut (one of the profiled targets, at
  // most target_sparsity); nullopt = kDefaultGateSparsity capped at target_sparsity, 0 = none.
  std::optional<float> gate_sparsity;
  std::string predictor_path;            // empty: the model file's own predictors, if any
};

// Parses the mode, reads the statistics and predictors it needs (checked against the model's
// shapes) and builds the plan. A PowerInfer model carries its predictors (blk.N.fc1/fc2), so
// `predicted` needs no --predictor for it. Errors say which flag is missing or wrong.
absl::StatusOr<SparsityPlan> SparsityPlanFromFlags(const Model& model,
                                                   const SparsityFlags& flags);

}  // namespace thermocline
