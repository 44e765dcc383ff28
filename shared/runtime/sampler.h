// Token sampling: penalties, temperature, top-k, top-p, min-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace thermocline {

struct SamplingParams {
  float temperature = 0.8f;  // 0 = greedy (argmax; lowest id wins ties)
  int32_t top_k = 40;        // 0 = off
  float top_p = 0.95f;       // 1 = off
  float min_p = 0.05f;       // 0 = off; drop tokens with p < min_p * p_max
  float repetition_penalty = 1.0f;  // 1 = off; llama.cpp semantics (divide positive logits)
  float presence_penalty = 0.0f;    // subtracted once from every token seen in the window
  float frequency_penalty = 0.0f;   // subtracted per occurrence in the window
  int32_t penalty_window = 64;      // last N tokens of the sequence (prompt included)
  uint64_t seed = 0;
};

// Checks ranges; the error names the field.
absl::Status ValidateSamplingParams(const SamplingParams& params);

// Sampling is defined on finite logits only: a NaN or inf anywhere in the row (a NaN weight, an
// overflowing activation) is an InternalError naming the position, never a silent token 0.
absl::Status CheckFiniteLogits(std::span<const float> logits, int64_t position);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token from `logits` given the sequence so far (prompt + generated).
  // Identical params, seed and inputs give identical choices. The penalties apply before every
  // mode, greedy included. NaN logits never win; empty `logits` gives -1. `params` are expected
  // to pass ValidateSamplingParams; other values do not crash but their result is unspecified.
  // `allowed` (structured output): when not empty, token i may be picked only if allowed[i]
  // (ids past its end may not); the others count as -inf logits, before penalties and in every
  // mode. At least one token must be allowed. Empty: no mask, the same choices as before it
  // existed.
  int32_t Sample(std::span<const float> logits, std::span<const int32_t> history,
                 std::span<const uint8_t> allowed = {});

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<double> probs_;
};

}  // namespace thermocline
