#include "shared/sparsity/profiler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// The stored act_hist: one bin per octave over [2^-32, 2^16), plus the two open ends.
constexpr int kHistLog2Min = -32;
constexpr int kHistOctaves = 48;

// Below this many gate values a call is counted on the caller alone: fanning out would cost
// more than the counting.
constexpr int64_t kMinParallelValues = 1 << 15;

// Counts what the profile needs from every layer's gate pre-activations. Pass 1 fills the
// magnitude histograms and the gate > 0 counts; pass 2 (SiLU only) counts, per neuron, the
// magnitudes at or above the group's frequency cut. A group is a layer's FFN, or in MoE layers
// one expert (over the rows the router sent to it): each gets its own histograms and cuts.
class ProfileObserver final : public FfnObserver {
 public:
  ProfileObserver(const ModelConfig& config, ThreadPool& pool)
      : config_(config), pool_(pool), layers_(config.n_layers), scratch_(pool.size()) {
    for (int64_t l = 0; l < config.n_layers; ++l) {
      const bool moe = l < static_cast<int64_t>(config.layers.size()) && config.layers[l].moe;
      layers_[l].resize(moe ? config.n_experts : 1);
      for (Group& g : layers_[l]) {
        g.positive.assign(config.ffn_dim, 0);
        g.above_cut.assign(config.ffn_dim, 0);
      }
    }
  }

  struct Group {
    MagnitudeHistogram hist;
    MagnitudeHistogram coeff_hist;  // |act(gate) * up|: the weight of the neuron's down row
    std::vector<int64_t> positive;   // rows with gate > 0, per neuron
    std::vector<int64_t> above_cut;  // pass 2: rows with magnitude >= cut, per neuron
    int64_t observed = 0;            // rows seen in the current pass
    int64_t non_finite = 0;
  };

  // cuts[layer][group]: the frequency cut of each group.
  void StartSecondPass(std::vector<std::vector<float>> cuts) {
    second_pass_ = true;
    cuts_ = std::move(cuts);
    for (auto& groups : layers_) {
      for (Group& g : groups) g.observed = 0;
    }
  }
  const std::vector<Group>& groups(int64_t l) const { return layers_[l]; }
  // Tokens seen by `layer` in the current pass (an MoE layer sees n_experts_used rows each).
  int64_t tokens(int64_t layer) const {
    int64_t rows = 0;
    for (const Group& g : layers_[layer]) rows += g.observed;
    return layers_[layer].size() > 1 ? rows / std::max<int64_t>(1, config_.n_experts_used) : rows;
  }

  void OnFfn(int64_t layer, const float* /*h*/, const float* gate, const float* up,
             int64_t n_tokens) override {
    Observe(layer, 0, gate, up, n_tokens);
  }
  void OnExpertFfn(int64_t layer, int64_t expert, const float* gate, const float* up,
                   int64_t n_rows) override {
    Observe(layer, expert, gate, up, n_rows);
  }

 private:
  void Observe(int64_t layer, int64_t group, const float* gate, const float* up,
               int64_t n_tokens) {
    Group& L = layers_[layer][group];
    L.observed += n_tokens;
    const int64_t nf = config_.ffn_dim;
    std::vector<int64_t> bad(pool_.size(), 0);
    // Neuron range `share` of `shares`, counted into thread tid's scratch (counts merge in any
    // order, so which thread runs a share does not matter).
    auto work = [&](int tid, int64_t share, int64_t shares) {
      const int64_t begin = nf * share / shares, end = nf * (share + 1) / shares;
      if (begin == end) return;
      if (second_pass_) {
        const float cut = cuts_[layer][group];
        for (int64_t t = 0; t < n_tokens; ++t) {
          const float* g = gate + t * nf;
          for (int64_t i = begin; i < end; ++i) {
            // Non-finite values were already counted (and fail the profile) in pass 1.
            if (ActivationMagnitude(config_.activation, g[i]) >= cut) ++L.above_cut[i];
          }
        }
        return;
      }
      Scratch& s = scratch_[tid];
      if (s.counts.empty()) {
        s.counts.assign(MagnitudeHistogram::kBins, 0);
        s.coeff_counts.assign(MagnitudeHistogram::kBins, 0);
      }
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* g = gate + t * nf;
        const float* u = up != nullptr ? up + t * nf : nullptr;
        for (int64_t i = begin; i < end; ++i) {
          const float x = g[i];
          const float a = ActivationMagnitude(config_.activation, x);
          const float coeff = up != nullptr ? a * std::fabs(u[i]) : a;
          if (!std::isfinite(x) || !std::isfinite(coeff)) {
            ++bad[tid];
            continue;
          }
          if (x > 0.0f) ++L.positive[i];
          const int key = MagnitudeHistogram::Key(a);
          ++s.counts[key];
          s.min_key = std::min(s.min_key, key);
          s.max_key = std::max(s.max_key, key);
          const int ckey = MagnitudeHistogram::Key(coeff);
          ++s.coeff_counts[ckey];
          s.min_ckey = std::min(s.min_ckey, ckey);
          s.max_ckey = std::max(s.max_ckey, ckey);
        }
      }
    };
    if (n_tokens * nf < kMinParallelValues || pool_.size() == 1) {
      work(0, 0, 1);
    } else {
      const int64_t shares = pool_.size();
      pool_.ForEachPiece(shares, [&](int tid, int64_t share) { work(tid, share, shares); });
    }
    if (second_pass_) return;
    // Per-thread counts merge into the layer's histogram over the range they touched only, which
    // is a small part of the 65536 bins for real activations.
    for (size_t tid = 0; tid < scratch_.size(); ++tid) {
      Scratch& s = scratch_[tid];
      for (int k = s.min_key; k <= s.max_key; ++k) {
        if (s.counts[k] != 0) L.hist.AddCount(k, s.counts[k]);
        s.counts[k] = 0;
      }
      for (int k = s.min_ckey; k <= s.max_ckey; ++k) {
        if (s.coeff_counts[k] != 0) L.coeff_hist.AddCount(k, s.coeff_counts[k]);
        s.coeff_counts[k] = 0;
      }
      s.min_key = s.min_ckey = MagnitudeHistogram::kBins;
      s.max_key = s.max_ckey = -1;
      L.non_finite += bad[tid];
    }
  }

  struct Scratch {
    std::vector<uint32_t> counts, coeff_counts;
    int min_key = MagnitudeHistogram::kBins, min_ckey = MagnitudeHistogram::kBins;
    int max_key = -1, max_ckey = -1;
  };
  const ModelConfig& config_;
  ThreadPool& pool_;
  std::vector<std::vector<Group>> layers_;  // [layer][group]
  std::vector<Scratch> scratch_;
  bool second_pass_ = false;
  std::vector<std::vector<float>> cuts_;
};

// Share of the total carried by the top `fraction` of the values.
double TopShare(std::vector<float> values, double fraction) {
  const double total = std::accumulate(values.begin(), values.end(), 0.0);
  if (total <= 0 || values.empty()) return 0;
  const size_t k = std::max<size_t>(
      1, static_cast<size_t>(std::ceil(fraction * static_cast<double>(values.size()))));
  std::partial_sort(values.begin(), values.begin() + std::min(k, values.size()), values.end(),
                    std::greater<float>());
  double top = 0;
  for (size_t i = 0; i < k && i < values.size(); ++i) top += values[i];
  return top / total;
}

}  // namespace

int MagnitudeHistogram::Key(float magnitude) {
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  return static_cast<int>((bits & 0x7FFFFFFFu) >> 15);
}

float MagnitudeHistogram::Quantile(double share) const {
  if (total_ == 0) return 0.0f;
  const double target = share * static_cast<double>(total_);
  double cum = 0;
  for (int b = 0; b < kBins; ++b) {
    const int64_t c = counts_[b];
    if (c == 0) continue;
    if (cum + static_cast<double>(c) >= target) {
      const double frac = std::clamp((target - cum) / static_cast<double>(c), 0.0, 1.0);
      const double lo = FromBits(static_cast<uint32_t>(b) << 15);
      const double hi = FromBits(static_cast<uint32_t>(b + 1) << 15);
      return static_cast<float>(lo + frac * (hi - lo));
    }
    cum += static_cast<double>(c);
  }
  return FromBits(static_cast<uint32_t>(kBins - 1) << 15);
}

double MagnitudeHistogram::ShareBelow(float c) const {
  if (total_ == 0) return 0.0;
  if (!(c > 0.0f)) return 0.0;
  const int key = Key(c);
  double below = 0;
  for (int b = 0; b < key; ++b) below += static_cast<double>(counts_[b]);
  const double lo = FromBits(static_cast<uint32_t>(key) << 15);
  const double hi = FromBits(static_cast<uint32_t>(key + 1) << 15);
  below += static_cast<double>(counts_[key]) * (c - lo) / (hi - lo);
  return below / static_cast<double>(total_);
}

std::vector<float> MagnitudeHistogram::OctaveShares(int log2_min, int octaves) const {
  std::vector<float> out(octaves + 2, 0.0f);
  if (total_ == 0) return out;
  const int e_min = log2_min + 127;  // biased exponent of 2^log2_min
  std::vector<double> sums(out.size(), 0.0);
  for (int b = 0; b < kBins; ++b) {
    if (counts_[b] == 0) continue;
    const int e = b >> 8;  // the key's top 8 bits are the biased exponent
    const int bin = e < e_min ? 0 : std::min(e - e_min + 1, octaves + 1);
    sums[bin] += static_cast<double>(counts_[b]);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<float>(sums[i] / static_cast<double>(total_));
  }
  return out;
}

absl::Status ValidateProfileOptions(const ProfileOptions& o, const ModelConfig& config) {
  if (o.window < 2 || o.window > config.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("--window ", o.window, " must be in [2, ",
                                                   config.context_length,
                                                   "] (the model's context length)"));
  }
  if (o.batch < 1)
    return absl::InvalidArgumentError(absl::StrCat("batch ", o.batch, " must be >= 1"));
  if (o.targets.empty())
    return absl::InvalidArgumentError("--targets: at least one target is needed");
  for (size_t i = 0; i < o.targets.size(); ++i) {
    if (!(o.targets[i] > 0.0f && o.targets[i] < 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--targets: ", o.targets[i], " is not a sparsity in (0, 1)"));
    }
    if (i > 0 && !(o.targets[i] > o.targets[i - 1])) {
      return absl::InvalidArgumentError("--targets must be strictly ascending");
    }
  }
  bool found = false;
  for (float t : o.targets) found |= std::fabs(t - o.frequency_target) <= 1e-4f;
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat("--frequency-target ", o.frequency_target, " must be one of the --targets"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProfileResult> ProfileActivations(const Model& model,
                                                 std::span<const int32_t> tokens,
                                                 const ProfileOptions& options, ThreadPool& pool) {
  const ModelConfig& c = model.config();
  TC_RETURN_IF_ERROR(ValidateProfileOptions(options, c));
  const bool relu = IsReluFamily(c.activation);
  TC_ASSIGN_OR_RETURN(KvCache kv, KvCache::Create(c, 1, options.window, GgmlType::kF32));
  ProfileObserver observer(c, pool);
  DenseFfn ffn(model, pool);
  ffn.set_observer(&observer);
  ForwardPass pass(model, kv, pool, &ffn);

  ProfileResult result;
  result.passes = relu ? 1 : 2;
  CorpusWindowOptions wo;
  wo.window = options.window;
  wo.batch = options.batch;
  wo.want_logits = false;
  if (options.progress) wo.progress_label = relu ? "profile" : "profile pass 1/2";
  auto ignore = [](std::span<const int32_t>, std::span<const float>) {};
  TC_ASSIGN_OR_RETURN(result.windows, RunCorpusWindows(pass, tokens, wo, ignore));

  for (int64_t l = 0; l < c.n_layers; ++l) {
    int64_t non_finite = 0;
    for (const auto& g : observer.groups(l)) non_finite += g.non_finite;
    if (non_finite > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": ", non_finite,
                       " gate pre-activations or coefficients were not finite (the model's weights or the forward "
                       "pass are broken)"));
    }
  }

  ActivationStats& s = result.stats;
  s.criterion = relu ? "relu" : "magnitude";
  s.targets = options.targets;
  s.frequency_target = options.frequency_target;
  s.dim = c.dim;
  s.ffn_dim = c.ffn_dim;
  s.n_experts = c.n_experts;
  s.tokens = observer.tokens(0);
  s.hist_log2_min = static_cast<float>(kHistLog2Min);
  s.hist_bins_per_octave = 1;
  s.layers.resize(c.n_layers);
  size_t freq_index = 0;
  for (size_t i = 0; i < s.targets.size(); ++i) {
    if (std::fabs(s.targets[i] - s.frequency_target) <= 1e-4f) freq_index = i;
  }
  std::vector<std::vector<float>> frequency_cuts(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto& groups = observer.groups(l);
    LayerActivationStats& L = s.layers[l];
    L.experts = groups.size() > 1 ? static_cast<int64_t>(groups.size()) : 0;
    for (size_t g = 0; L.experts > 0 && g < groups.size(); ++g) {
      const double n = static_cast<double>(std::max<int64_t>(1, observer.tokens(l)));
      L.expert_share.push_back(static_cast<float>(static_cast<double>(groups[g].observed) / n));
    }
    for (const auto& g : groups) {
      for (float t : s.targets) {
        // A cut of 0 would keep every neuron, exact zeros included; the smallest positive float
        // keeps exactly the nonzero ones, which is what a sparse executor can skip anyway.
        L.cuts.push_back(std::max(g.hist.Quantile(t), std::numeric_limits<float>::denorm_min()));
        L.coeff_cuts.push_back(
            std::max(g.coeff_hist.Quantile(t), std::numeric_limits<float>::denorm_min()));
      }
      frequency_cuts[l].push_back(L.cuts[L.cuts.size() - s.targets.size() + freq_index]);
    }
    if (groups.size() == 1) {
      L.histogram = groups[0].hist.OctaveShares(kHistLog2Min, kHistOctaves);
    } else {
      // The layer's histogram for reports: every expert's magnitudes together.
      MagnitudeHistogram all;
      for (const auto& g : groups) {
        for (int k = 0; k < MagnitudeHistogram::kBins; ++k) {
          if (g.hist.count(k) != 0) all.AddCount(k, g.hist.count(k));
        }
      }
      L.histogram = all.OctaveShares(kHistLog2Min, kHistOctaves);
    }
  }

  if (!relu) {
    observer.StartSecondPass(frequency_cuts);
    if (options.progress) wo.progress_label = "profile pass 2/2";
    TC_RETURN_IF_ERROR(RunCorpusWindows(pass, tokens, wo, ignore).status());
  }

  result.layers.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto& groups = observer.groups(l);
    LayerActivationStats& L = s.layers[l];
    L.frequency.resize(groups.size() * c.ffn_dim);
    LayerProfileReport& r = result.layers[l];
    double positive = 0, rows = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& O = groups[g];
      const std::vector<int64_t>& counts = relu ? O.positive : O.above_cut;
      // Per expert, the share of the rows the router sent to it (0 for an expert never picked).
      const double n = static_cast<double>(std::max<int64_t>(1, O.observed));
      for (int64_t i = 0; i < c.ffn_dim; ++i) {
        L.frequency[g * c.ffn_dim + i] = static_cast<float>(static_cast<double>(counts[i]) / n);
        positive += static_cast<double>(O.positive[i]);
        if (counts[i] == 0) ++r.never_active;
      }
      rows += static_cast<double>(O.observed);
    }
    const double freq_sum = std::accumulate(L.frequency.begin(), L.frequency.end(), 0.0);
    r.gate_nonpositive = 1.0 - positive / (std::max(1.0, rows) * static_cast<double>(c.ffn_dim));
    r.measured_sparsity = 1.0 - freq_sum / static_cast<double>(L.frequency.size());
    r.top10_share = TopShare(L.frequency, 0.1);
    r.top20_share = TopShare(L.frequency, 0.2);
  }
  return result;
}

std::string FormatProfileReport(const ProfileResult& result) {
  const ActivationStats& s = result.stats;
  const bool relu = s.criterion == "relu";
  std::string out = absl::StrFormat(
      "profiled %d positions per layer (%d windows), criterion %s, %d pass%s\n", s.tokens,
      result.windows, relu ? "relu (active = relu(gate) > 0)" : "magnitude (|silu(gate)| >= cut)",
      result.passes, result.passes == 1 ? "" : "es");
  out += relu ? "frequencies: share of tokens with relu(gate) > 0\n"
              : absl::StrFormat(
                    "frequencies: share of tokens with |silu(gate)| >= the cut at "
                    "target sparsity %.2f\n",
                    s.frequency_target);
  out += absl::StrFormat("%-5s %8s", "layer", "gate<=0");
  for (float t : s.targets) out += absl::StrFormat(" %9s", absl::StrFormat("cut@%.2f", t));
  out += absl::StrFormat(" %9s %7s %7s %6s\n", "sparsity", "top10%", "top20%", "never");
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const LayerProfileReport& r = result.layers[l];
    out += absl::StrFormat("%-5d %8.4f", l, r.gate_nonpositive);
    const LayerActivationStats& L = s.layers[l];
    const size_t n_t = s.targets.size();
    const int64_t groups = std::max<int64_t>(1, L.experts);
    for (size_t t = 0; t < n_t; ++t) {
      double cut = 0;  // MoE layers: the mean of the experts' cuts
      for (int64_t g = 0; g < groups; ++g) cut += L.cuts[g * n_t + t];
      out += absl::StrFormat(" %9.3g", cut / static_cast<double>(groups));
    }
    out += absl::StrFormat(" %9.4f %7.4f %7.4f %6d\n", r.measured_sparsity, r.top10_share,
                           r.top20_share, r.never_active);
  }
  out +=
      "gate<=0: share of (token, neuron) pairs a ReLU zeroes (the natural sparsity of a ReLU "
      "model); sparsity: 1 - mean frequency;\ntop10%/top20%: share of all activations carried "
      "by the 10%/20% most frequently active neurons of the layer; never: neurons never "
      "active\n";
  if (s.n_experts > 0) {
    out += absl::StrFormat(
        "MoE layers: cuts and frequencies per expert over the tokens routed to it (the cut "
        "columns show the mean over the %d experts); the shared expert is not profiled\n",
        s.n_experts);
  }
  return out;
}

}  // namespace thermocline
