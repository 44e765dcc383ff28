// Which FFN neurons run, per layer (see DESIGN.md, "Sparsity modes"):
//   dense      every neuron, as DenseFfn computes it;
//   exact      ReLU family: the gate for every neuron, then up and down only where the
//              activation is > 0 (the other products are exactly zero, so nothing is lost);
//   threshold  neurons whose |act(gate . h)| is under the layer's calibrated cut are skipped
//              (CATS/TEAL-style; the cut comes from `thermocline profile`);
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
#include "shared/model/llama_model.h"
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
  std::vector<float> cuts;          // [n_layers]; 0 = no cut
  std::shared_ptr<const PredictorSet> predictors;

  // The same mode for every layer, no cuts, no predictors.
  static SparsityPlan Uniform(SparsityMode mode, int64_t n_layers);

  // One mode for every layer of `model`, with what it needs: `stats` and `target_sparsity`
  // (threshold: the cut of each layer for that target, via ActivationStats::CutFor; predicted
  // on a SiLU model: optional), `predictors` (predicted). Then Validate.
  static absl::StatusOr<SparsityPlan> ForModel(const LlamaConfig& config, SparsityMode mode,
                                               const ActivationStats* stats,
                                               std::optional<float> target_sparsity,
                                               std::shared_ptr<const PredictorSet> predictors);

  SparsityMode mode(int64_t layer) const { return modes[layer]; }
  // Which of a layer's candidates run (NeuronFfn's filter), for every executor of the plan:
  // the single-process SparseFfn and both halves of a split (hot and cold neurons are filtered
  // alike, so the split computes the same neurons as one process). None for dense layers.
  NeuronFilter FilterFor(int64_t layer, FfnActivation activation) const;
  bool AllDense() const;

  // Checks the plan against the model: one entry per layer, exact only on ReLU models, a
  // positive finite cut for every threshold layer, predictors for every predicted layer (with
  // the model's shapes). Errors name the layer and what is missing.
  absl::Status Validate(const LlamaConfig& config) const;
};

// The command-line face of a plan, shared by `generate`, `perplexity`, the benchmarks and the
// workers: --sparsity MODE [--stats S.gguf --target-sparsity T] [--predictor P.gguf].
struct SparsityFlags {
  std::string mode = "dense";
  std::string stats_path;                // activation statistics from `thermocline profile`
  std::optional<float> target_sparsity;  // picks the cuts in the statistics
  std::string predictor_path;            // empty: the model file's own predictors, if any
};

// Parses the mode, reads the statistics and predictors it needs (checked against the model's
// shapes) and builds the plan. A PowerInfer model carries its predictors (blk.N.fc1/fc2), so
// `predicted` needs no --predictor for it. Errors say which flag is missing or wrong.
absl::StatusOr<SparsityPlan> SparsityPlanFromFlags(const LlamaModel& model,
                                                   const SparsityFlags& flags);

}  // namespace thermocline
