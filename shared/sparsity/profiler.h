// `thermocline profile`: per-layer, per-neuron activation statistics of a model over a corpus.
//
// The dense model runs over the corpus in windows (RunCorpusWindows) with an FfnObserver that
// sees every layer's gate pre-activations. A neuron's magnitude for one token is |act(gate)|
// (act = relu or silu, the model's own), so it depends on the gate row alone.
//
// ReLU models (criterion "relu"): a neuron is active when relu(gate) > 0; one pass.
// SiLU models (criterion "magnitude"): pass 1 builds, per layer, a histogram of all magnitudes
// and takes each target sparsity's cut from it; pass 2 runs the corpus again and counts, per
// neuron, the tokens whose magnitude is >= the cut of --frequency-target. Two passes cost twice
// the forward time but make the stored frequencies exact for the stored cut, with memory
// independent of the corpus (per-neuron histograms would need ffn_dim x bins counters a layer).
//
// Cut precision: the histogram has one bin per value of the top 16 bits of the float (8
// exponent bits + 8 mantissa bits: 256 linear bins per octave, over the whole float range), and
// the cut is interpolated linearly inside the bin where the cumulative share crosses the target.
// So the cut is within one bin (relative error < 2^-8 = 0.4%) of an exact quantile, and the
// share of magnitudes below it differs from the target by at most the share held by that one bin
// (well under 0.1% for any smooth distribution over thousands of tokens).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/runtime/ops.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

// Counts of non-negative magnitudes in 65536 bins keyed by the top 16 bits of the float, which
// are monotone in the value (see the file comment for the precision this gives).
class MagnitudeHistogram {
 public:
  static constexpr int kBins = 1 << 16;
  static int Key(float magnitude);  // magnitude must be finite and >= 0

  MagnitudeHistogram() : counts_(kBins, 0) {}
  void Add(float magnitude) {
    ++counts_[Key(magnitude)];
    ++total_;
  }
  void AddCount(int key, int64_t n) {
    counts_[key] += n;
    total_ += n;
  }
  int64_t total() const { return total_; }
  int64_t count(int key) const { return counts_[key]; }

  // The value c whose share of magnitudes below it is `share` (in (0, 1)), interpolated linearly
  // inside the bin where the cumulative count crosses share * total. 0 when empty.
  float Quantile(double share) const;
  // Share of the magnitudes < c, interpolated the same way (exact at bin edges).
  double ShareBelow(float c) const;
  // Shares per octave: bin 0 below 2^log2_min (zeros included), one bin per octave up to
  // 2^(log2_min + octaves), the last bin above. log2_min must be in [-126, 127 - octaves].
  std::vector<float> OctaveShares(int log2_min, int octaves) const;

 private:
  std::vector<int64_t> counts_;
  int64_t total_ = 0;
};

struct ProfileOptions {
  int64_t window = 256;  // positions per corpus window (BOS included); at most the model context
  int64_t batch = 256;   // positions per forward call
  // Ascending, in (0, 1). The low ones serve threshold mode's gate cut (kDefaultGateSparsity).
  std::vector<float> targets = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
  float frequency_target = 0.5f;  // SiLU: the target whose cut defines the frequencies
  bool progress = false;          // progress bars with ETA on stderr
};

// What the profile measured per layer, for the report (not stored in the stats file).
struct LayerProfileReport {
  double gate_nonpositive = 0;   // share of (token, neuron) with gate <= 0: ReLU's natural sparsity
  double measured_sparsity = 0;  // 1 - mean frequency: the sparsity the stored frequencies give
  double top10_share = 0;        // share of all activations carried by the 10% most active neurons
  double top20_share = 0;        // ... by the 20% most active
  int64_t never_active = 0;      // neurons with frequency 0
};

struct ProfileResult {
  ActivationStats stats;
  std::vector<LayerProfileReport> layers;
  int64_t windows = 0;  // windows per pass
  int passes = 1;
};

// Checks the options (targets, frequency target, window against the model's context).
absl::Status ValidateProfileOptions(const ProfileOptions& options, const ModelConfig& config);

// Runs the profile over `tokens` (a tokenized corpus, no BOS) with the forward pass on `pool`.
absl::StatusOr<ProfileResult> ProfileActivations(const Model& model,
                                                 std::span<const int32_t> tokens,
                                                 const ProfileOptions& options, ThreadPool& pool);

// The per-layer table `thermocline profile` prints.
std::string FormatProfileReport(const ProfileResult& result);

// The magnitude the profile counts for one gate pre-activation (the up pre-activation in FFNs
// without a gate): relu(g) for the ReLU family, |silu(g)| or |gelu(g)|.
inline float ActivationMagnitude(FfnActivation act, float gate) {
  if (IsReluFamily(act)) return gate > 0.0f ? gate : 0.0f;
  if (act == FfnActivation::kGelu) return std::fabs(Gelu(gate));
  return std::fabs(gate / (1.0f + std::exp(-gate)));
}

}  // namespace thermocline
