#include "shared/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace thermocline {

absl::Status CheckFiniteLogits(std::span<const float> logits, int64_t position) {
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      return absl::InternalError(absl::StrCat(
          "the logits after position ", position, " are not finite (token ", i, " is ",
          logits[i], "): a weight or activation of the model is NaN or infinite"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  auto bad = [](const char* field, const char* rule, auto value) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling parameter ", field, " must be ", rule, ", got ", value));
  };
  // Comparisons are written so that NaN fails them.
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f)) {
    return bad("temperature", "finite and >= 0", p.temperature);
  }
  if (p.top_k < 0) return bad("top_k", ">= 0 (0 = off)", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", "in (0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", "in [0, 1]", p.min_p);
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f)) {
    return bad("repetition_penalty", "finite and > 0 (1 = off)", p.repetition_penalty);
  }
  if (!std::isfinite(p.presence_penalty)) {
    return bad("presence_penalty", "finite", p.presence_penalty);
  }
  if (!std::isfinite(p.frequency_penalty)) {
    return bad("frequency_penalty", "finite", p.frequency_penalty);
  }
  if (p.penalty_window < 0) return bad("penalty_window", ">= 0", p.penalty_window);
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  // Values that could turn logits into NaN are neutralized; the rest are harmless as they are.
  if (!(std::isfinite(params_.repetition_penalty) && params_.repetition_penalty > 0.0f)) {
    params_.repetition_penalty = 1.0f;
  }
  if (!std::isfinite(params_.presence_penalty)) params_.presence_penalty = 0.0f;
  if (!std::isfinite(params_.frequency_penalty)) params_.frequency_penalty = 0.0f;
}

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// NaN never wins and +inf counts as the largest finite value, so that the softmax stays finite
// whatever a model (or a penalty) produced.
float Tame(float l) {
  if (std::isnan(l)) return -kInf;
  if (l == kInf) return std::numeric_limits<float>::max();
  return l;
}

// Uniform double in [0, 1) from the top 53 bits of one engine output. The engine's output
// sequence is fixed by the standard, unlike std::uniform_real_distribution's mapping, so a seed
// picks the same tokens with every standard library.
double UniformDouble(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Orders candidates by logit, highest first, lowest id among equals: a strict total order, so the
// result does not depend on the sort algorithm.
bool HigherLogit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

int32_t Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history,
                        std::span<const uint8_t> allowed) {
  const auto n = static_cast<int32_t>(
      std::min<size_t>(logits.size(), static_cast<size_t>(std::numeric_limits<int32_t>::max())));
  if (n == 0) return -1;

  candidates_.resize(n);
  for (int32_t i = 0; i < n; ++i) candidates_[i] = {Tame(logits[i]), i};
  if (!allowed.empty()) {
    for (int32_t i = 0; i < n; ++i) {
      if (static_cast<size_t>(i) >= allowed.size() || !allowed[i]) candidates_[i].first = -kInf;
    }
  }

  // Penalties over the last penalty_window tokens; ids outside the vocabulary are ignored.
  const bool any_penalty = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                           params_.frequency_penalty != 0.0f;
  if (any_penalty && params_.penalty_window > 0 && !history.empty()) {
    const size_t window = std::min(history.size(), static_cast<size_t>(params_.penalty_window));
    absl::flat_hash_map<int32_t, int32_t> counts;
    for (int32_t id : history.subspan(history.size() - window)) {
      if (id >= 0 && id < n) ++counts[id];
    }
    for (const auto& [id, count] : counts) {
      float& l = candidates_[id].first;
      if (!std::isfinite(l)) continue;
      l = l > 0.0f ? l / params_.repetition_penalty : l * params_.repetition_penalty;
      l -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
      l = Tame(l);
    }
  }

  if (!(params_.temperature > 0.0f)) {
    return std::min_element(candidates_.begin(), candidates_.end(), HigherLogit)->second;
  }

  // Top-k, then everything sorted by logit (needed for top-p).
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(),
                      HigherLogit);
    candidates_.resize(keep);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), HigherLogit);
  }
  const float max_logit = candidates_[0].first;
  if (max_logit == -kInf) return candidates_[0].second;

  // Softmax with temperature, in double; exp(0) = 1 for the best token keeps the sum >= 1.
  std::vector<double>& probs = probs_;
  probs.resize(keep);
  double sum = 0.0;
  const double inv_t = 1.0 / static_cast<double>(params_.temperature);
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((static_cast<double>(candidates_[i].first) - max_logit) * inv_t);
    sum += probs[i];
  }
  for (size_t i = 0; i < keep; ++i) probs[i] /= sum;

  // Top-p: the smallest prefix whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t i = 0;
    while (i < keep) {
      cum += probs[i++];
      if (cum >= params_.top_p) break;
    }
    keep = i;
  }
  // Min-p: drop tokens less likely than min_p times the best one (probs[0], sorted).
  if (params_.min_p > 0.0f) {
    const double cut = static_cast<double>(params_.min_p) * probs[0];
    size_t i = 1;
    while (i < keep && probs[i] >= cut) ++i;
    keep = i;
  }

  // Tokens whose probability underflowed to 0 must never be drawn, not even by rounding.
  while (keep > 1 && probs[keep - 1] == 0.0) --keep;
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += probs[i];
  const double u = UniformDouble(rng_) * total;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (u < cum) return candidates_[i].second;
  }
  // Rounding can leave u == cum at the very end; the last kept token owns that sliver.
  return candidates_[keep - 1].second;
}

}  // namespace thermocline
