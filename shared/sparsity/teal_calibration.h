// TEAL's offline step (Liu et al. 2024, section 4): the magnitude distribution of every
// projection input over a corpus, then the block-wise greedy allocation of sparsity.
//
// Pass 1 runs the dense model over the corpus and histograms |x| of each of a layer's four
// inputs (MagnitudeHistogram, profiler.h: within 0.4% of an exact quantile); the profile keeps
// its percentiles.
//
// Pass 2, per block (layer) on the first greedy_tokens tokens, the other blocks dense: start
// every projection at sparsity 0; repeatedly try raising each projection's sparsity by `step`
// (its cut moving to the input's matching quantile), measure the block's output error
// sum ||x_l - x_l_dense||^2 / sum ||x_l_dense||^2 (x_l: the residual stream after the block,
// every position computed input-sparse, as the dense product of the masked inputs:
// TealPlan::masked), and keep the raise that costs the least; when the
// block's parameter-weighted sparsity (BlockSparsity) reaches a target, record the projection
// sparsities and cuts for it. Every block gets the same target, so the model-level sparsity is
// the target (within one step of the projection crossing it: at most step * its share of the
// block's weights over the target).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/teal_profile.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

struct TealCalibrationOptions {
  int64_t window = 256;                              // positions per corpus window (BOS included)
  int64_t batch = 256;                               // positions per forward call
  std::vector<float> targets = {0.25f, 0.4f, 0.5f};  // ascending, in (0, 1)
  float step = 0.05f;                                // sparsity raise per greedy move
  float max_sparsity = 0.95f;                        // no projection goes beyond
  int64_t greedy_tokens = 510;  // the first corpus tokens the greedy measures on (2 windows)
  bool progress = false;
};

absl::Status ValidateTealCalibrationOptions(const TealCalibrationOptions& options,
                                            const ModelConfig& config);

// Builds the profile from `tokens` (a tokenized corpus, no BOS).
absl::StatusOr<TealProfile> CalibrateTeal(const Model& model, std::span<const int32_t> tokens,
                                          const TealCalibrationOptions& options, ThreadPool& pool);

// The table `thermocline teal-calibrate` prints: per target and layer, each projection's
// sparsity and the block's.
std::string FormatTealProfile(const Model& model, const TealProfile& profile);

}  // namespace thermocline
