// Per-neuron activation statistics from `thermocline profile`, stored as GGUF.
//
// Activation magnitude of neuron i for one token is |act(gate_i . h)| with act = relu or silu:
// it depends on the gate row alone, so a neuron under the cut skips its up and down rows
// (CATS-style). For ReLU models "active" means magnitude > 0; for SiLU models, magnitude >= the
// layer's cut for a target sparsity.
//
// File layout (GGUF, general.architecture = "thermocline.stats"):
//   thermocline.stats.tokens            u64   tokens profiled
//   thermocline.stats.criterion         str   "relu" | "magnitude"
//   thermocline.stats.targets           f32[] target sparsities, ascending (e.g. 0.3 .. 0.9)
//   thermocline.stats.frequency_target  f32   for "magnitude": the target whose cut defines
//                                             the frequencies below (ReLU: ignored)
//   thermocline.stats.model_dim / model_ffn_dim / block_count   u32   shape checks on load
//   blk.N.act_freq   F32 [ffn_dim]       share of tokens on which the neuron was active
//   blk.N.act_cuts   F32 [targets]       per-layer magnitude cut reaching each target sparsity
//   blk.N.coef_cuts  F32 [targets] (optional, every layer or none) per-layer cut on the
//                                        coefficient |act(gate_i . h) * (up_i . h)| that scales
//                                        neuron i's down row, reaching each target share
//   blk.N.act_hist   F32 [bins] (optional) distribution of log magnitudes, for reports
//   thermocline.stats.hist_log2_min / hist_bins_per_octave   f32 / u32   act_hist bin edges
//                                             (present with act_hist)
//   thermocline.stats.expert_count  u32 (only for models with MoE layers) experts per MoE layer
// In mixture-of-experts layers the statistics are per expert, over the tokens the router sent
// to it: act_freq is [n_experts * ffn_dim] (flat ids e * ffn_dim + i, as placements number
// them; a frequency is the share of the expert's tokens), act_cuts and coef_cuts are
// [n_experts * targets], expert-major (expert e's cuts at [e * targets, (e + 1) * targets)),
// act_hist is the layer's, over every expert, and blk.N.expert_share F32 [n_experts] is the
// share of the layer's tokens the router sent to each expert (they sum to n_experts_used).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"

namespace thermocline {

struct LayerActivationStats {
  int64_t experts = 0;           // MoE layers: n_experts, and everything below is per expert
  std::vector<float> frequency;  // [ffn_dim], or [experts * ffn_dim]
  std::vector<float> cuts;       // [targets.size()], or [experts * targets.size()]
  std::vector<float> coeff_cuts;  // as cuts, or empty (profiles from before them)
  std::vector<float> histogram;  // optional
  std::vector<float> expert_share;  // MoE layers: [experts], share of tokens routed to each
};

struct ActivationStats {
  std::string criterion = "relu";  // "relu" or "magnitude"
  int64_t tokens = 0;
  std::vector<float> targets;
  float frequency_target = 0.5f;
  int64_t dim = 0, ffn_dim = 0;
  int64_t n_experts = 0;  // experts of the MoE layers (0: none)
  std::vector<LayerActivationStats> layers;
  // Bin edges of every layer's histogram (shares of all magnitudes of the layer, summing to 1):
  // bin 0 holds magnitudes below 2^hist_log2_min (zeros included); bin i in [1, bins - 2] holds
  // [2^(hist_log2_min + (i - 1) / hist_bins_per_octave), 2^(hist_log2_min + i / ...)); the last
  // bin holds the rest. Unused (0) when the layers carry no histogram.
  float hist_log2_min = 0;
  int32_t hist_bins_per_octave = 0;

  // The cut of `layer` for `target` (which must be one of `targets`, within 1e-4), or an error
  // listing the available targets. MoE layers need the expert (and other layers none).
  absl::StatusOr<float> CutFor(int64_t layer, float target, int64_t expert = -1) const;
  // The same for the coefficient cut; FailedPrecondition when the file has none.
  absl::StatusOr<float> CoeffCutFor(int64_t layer, float target, int64_t expert = -1) const;
};

absl::Status WriteActivationStats(const ActivationStats& stats, const std::string& path);
// Validates shapes against `config` when given.
absl::StatusOr<ActivationStats> ReadActivationStats(const std::string& path,
                                                    const ModelConfig* config = nullptr);

}  // namespace thermocline
