// The TEAL profile of a model: per layer, the magnitude distribution of each projection input
// over a calibration corpus, and for each model-level target sparsity the per-projection
// sparsities of TEAL's block-wise greedy allocation with the cuts that reach them. Written by
// `thermocline teal-calibrate` (teal_calibration.h), read by `--sparsity teal --teal-profile`.
//
// File layout (GGUF, general.architecture = "thermocline.teal"; docs/formats.md):
//   thermocline.teal.tokens         u64    corpus tokens whose inputs built the quantiles
//   thermocline.teal.greedy_tokens  u64    tokens the greedy allocation measured errors on
//   thermocline.teal.step           f32    the greedy's sparsity step per projection
//   thermocline.teal.targets        f32[]  model-level target sparsities, ascending, in (0, 1)
//   thermocline.teal.model_dim / block_count   u32   shape checks on load
//   blk.N.teal_quantiles  F32 [4 * 101]  input i (attn_in, attn_out, ffn_in, down_in) at
//                                        [i * 101 + q]: the magnitude under which q% of the
//                                        input's entries lie (q = 0..100; 100 = the largest)
//   blk.N.teal_sparsity   F32 [targets * 7]  target t, projection p (q k v o gate up down) at
//                                            [t * 7 + p]: the share of p's inputs dropped
//   blk.N.teal_cuts       F32 [targets * 7]  the magnitude cut giving that share (0 = dense)
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/teal.h"

namespace thermocline {

// The four distinct projection inputs of a layer.
enum class TealInput : int8_t { kAttnIn, kAttnOut, kFfnIn, kDownIn };
inline constexpr int kNumTealInputs = 4;
inline constexpr int kTealQuantiles = 101;  // 0%, 1%, ..., 100%
TealInput InputOf(Projection p);

struct TealLayerProfile {
  std::array<std::array<float, kTealQuantiles>, kNumTealInputs> quantiles{};
  std::vector<ProjectionValues> sparsity;  // [targets]
  std::vector<ProjectionValues> cuts;      // [targets]
};

struct TealProfile {
  int64_t tokens = 0, greedy_tokens = 0;
  float step = 0.05f;
  int64_t dim = 0;
  std::vector<float> targets;
  std::vector<TealLayerProfile> layers;

  // The magnitude cut that drops `share` of the layer's input (linear between quantiles).
  float CutFor(int64_t layer, TealInput input, float share) const;
  // The plan for one of the targets (within 1e-4), or an error listing them.
  absl::StatusOr<TealPlan> PlanFor(float target) const;
};

absl::Status WriteTealProfile(const TealProfile& profile, const std::string& path);
// Validates shapes against `config` when given.
absl::StatusOr<TealProfile> ReadTealProfile(const std::string& path,
                                            const ModelConfig* config = nullptr);

// The command-line face: --sparsity teal (every projection) or an FFN mode with TEAL on
// attention, --teal-sparsity T, --teal-profile P.gguf.
struct TealFlags {
  std::optional<float> sparsity;  // model-level target (with a profile) or per-row share
  std::string profile_path;       // calibrated cuts; empty: per-token top-k at `sparsity`
};

// The TEAL plan the flags ask for, or nullopt when TEAL is off. `ffn_mode` is --sparsity:
// "teal" sparsifies all seven projections (the FFN itself is then the dense one, which computes
// through the executor; SparsitySetupFromFlags in sparsity_setup.h reads it so); with "exact",
// "threshold" or "predicted" TEAL covers attention (q, k, v, o) and the sparse FFN the rest.
// Errors name the flag.
absl::StatusOr<std::optional<TealPlan>> TealPlanFromFlags(const Model& model,
                                                          const std::string& ffn_mode,
                                                          const TealFlags& flags);

// Whether split workers can run `plan`: on attention always; over the FFN (--sparsity teal)
// only with calibrated cuts, since a per-token share of down's inputs is a share of every
// neuron's activation, which neither worker holds alone. The error names the flag.
absl::Status CheckSplitTealPlan(const std::optional<TealPlan>& plan);

}  // namespace thermocline
