#include "shared/runtime/sampler.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace thermocline {
namespace {

using ::testing::HasSubstr;

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

// All filters off: plain softmax sampling at temperature t.
SamplingParams Plain(float t, uint64_t seed) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

std::vector<double> Softmax(const std::vector<float>& logits, double t) {
  double max = -1e300;
  for (float l : logits) max = std::max<double>(max, l);
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - max) / t);
  for (double& x : p) x /= sum;
  return p;
}

TEST(SamplerTest, ValidateAcceptsDefaults) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  EXPECT_TRUE(ValidateSamplingParams(Greedy()).ok());
  SamplingParams p;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.top_k = 0;
  p.penalty_window = 0;
  p.presence_penalty = -0.5f;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

TEST(SamplerTest, ValidateNamesTheField) {
  struct Case {
    void (*edit)(SamplingParams&);
    const char* field;
  };
  const Case cases[] = {
      {[](SamplingParams& p) { p.temperature = -0.1f; }, "temperature"},
      {[](SamplingParams& p) { p.temperature = std::numeric_limits<float>::infinity(); },
       "temperature"},
      {[](SamplingParams& p) { p.temperature = std::numeric_limits<float>::quiet_NaN(); },
       "temperature"},
      {[](SamplingParams& p) { p.top_k = -1; }, "top_k"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p"},
      {[](SamplingParams& p) { p.top_p = 1.01f; }, "top_p"},
      {[](SamplingParams& p) { p.top_p = std::numeric_limits<float>::quiet_NaN(); }, "top_p"},
      {[](SamplingParams& p) { p.min_p = -0.01f; }, "min_p"},
      {[](SamplingParams& p) { p.min_p = 1.5f; }, "min_p"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty"},
      {[](SamplingParams& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty"},
      {[](SamplingParams& p) { p.presence_penalty = std::numeric_limits<float>::infinity(); },
       "presence_penalty"},
      {[](SamplingParams& p) { p.frequency_penalty = std::numeric_limits<float>::quiet_NaN(); },
       "frequency_penalty"},
      {[](SamplingParams& p) { p.penalty_window = -1; }, "penalty_window"},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.edit(p);
    absl::Status st = ValidateSamplingParams(p);
    EXPECT_FALSE(st.ok()) << c.field;
    EXPECT_THAT(st.message(), HasSubstr(c.field));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler s(Greedy());
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 2.0f, -1.0f, 1.9f}, {}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{3.0f, 1.0f, 3.0f}, {}), 0);
  EXPECT_EQ(s.Sample(std::vector<float>{-5.0f, 7.0f, 7.0f, 7.0f}, {}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{std::nanf(""), -1.0f}, {}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{}, {}), -1);
}

TEST(SamplerTest, GreedyIgnoresFilters) {
  SamplingParams p = Greedy();
  p.top_k = 1;
  p.top_p = 0.01f;
  p.min_p = 0.9f;
  p.seed = 99;
  Sampler s(p);
  const std::vector<float> logits = {0.5f, 0.25f, 4.0f, 1.0f};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.Sample(logits, {}), 2);
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  SamplingParams p = Plain(1.5f, 1234);
  p.top_k = 1;
  Sampler top1(p);
  Sampler greedy(Greedy());
  for (int step = 0; step < 200; ++step) {
    std::vector<float> logits(300);
    for (float& l : logits) l = normal(gen);
    EXPECT_EQ(top1.Sample(logits, {}), greedy.Sample(logits, {}));
  }
}

std::vector<int32_t> Draws(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.Sample(logits, {}));
  return out;
}

TEST(SamplerTest, SeedDeterminesSequence) {
  const std::vector<float> logits = {1.0f, 1.1f, 0.9f, 1.2f, 0.8f, 1.05f, 0.95f, 1.15f};
  SamplingParams a = Plain(1.0f, 42);
  EXPECT_EQ(Draws(a, logits, 100), Draws(a, logits, 100));
  SamplingParams b = Plain(1.0f, 43);
  EXPECT_NE(Draws(a, logits, 100), Draws(b, logits, 100));
}

TEST(SamplerTest, PortableDrawIsPinned) {
  // The draw uses only mt19937_64's standard-defined output, so these values hold with any
  // standard library. Uniform logits: token = floor(u * 8) with u from the top 53 bits.
  std::mt19937_64 rng(5);
  std::vector<int32_t> expected;
  for (int i = 0; i < 20; ++i) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    expected.push_back(static_cast<int32_t>(u * 8));
  }
  EXPECT_EQ(Draws(Plain(1.0f, 5), std::vector<float>(8, 0.0f), 20), expected);
  // The 10000th output of a default-seeded mt19937_64 is fixed by the standard.
  std::mt19937_64 check;
  check.discard(9999);
  EXPECT_EQ(check(), 9981545732273789042ull);
}

// Chi-square goodness of fit of many draws against the softmax, with a fixed seed.
void ExpectMatchesDistribution(const SamplingParams& p, const std::vector<float>& logits,
                               const std::vector<double>& probs) {
  const int n = 200000;
  std::vector<int> counts(logits.size(), 0);
  Sampler s(p);
  for (int i = 0; i < n; ++i) ++counts[s.Sample(logits, {})];
  double chi2 = 0;
  int dof = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " should never be drawn";
      continue;
    }
    const double e = probs[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    ++dof;
  }
  // The 99.9th percentile of chi-square is below dof + 6 sqrt(dof) + 12 for these sizes; the
  // seed is fixed, so this is deterministic anyway.
  EXPECT_LT(chi2, dof + 6 * std::sqrt(dof) + 12) << "dof " << dof;
}

TEST(SamplerTest, DrawsFollowSoftmax) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 1.5f, 0.25f};
  for (float t : {0.5f, 1.0f, 2.0f}) {
    ExpectMatchesDistribution(Plain(t, 17), logits, Softmax(logits, t));
  }
}

TEST(SamplerTest, TopKRenormalizes) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 1.5f, 0.25f};
  SamplingParams p = Plain(1.0f, 3);
  p.top_k = 3;  // tokens 0, 6, 1
  std::vector<double> probs = Softmax(logits, 1.0);
  for (int i : {2, 3, 4, 5, 7}) probs[i] = 0;
  double sum = probs[0] + probs[1] + probs[6];
  for (double& x : probs) x /= sum;
  ExpectMatchesDistribution(p, logits, probs);
}

TEST(SamplerTest, TopPKeepsSmallestSetReachingP) {
  // Probabilities 0.5, 0.25, 0.125, 0.125: top_p 0.7 keeps the first two (0.75 >= 0.7).
  const std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.125f),
                                     std::log(0.125f)};
  SamplingParams p = Plain(1.0f, 11);
  p.top_p = 0.7f;
  ExpectMatchesDistribution(p, logits, {2.0 / 3, 1.0 / 3, 0, 0});
  p.top_p = 0.75f;  // exactly reached by the first two
  ExpectMatchesDistribution(p, logits, {2.0 / 3, 1.0 / 3, 0, 0});
  p.top_p = 0.4f;
  ExpectMatchesDistribution(p, logits, {1, 0, 0, 0});
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.125f),
                                     std::log(0.125f)};
  SamplingParams p = Plain(1.0f, 12);
  p.min_p = 0.3f;  // cut 0.15: keeps 0.5 and 0.25
  ExpectMatchesDistribution(p, logits, {2.0 / 3, 1.0 / 3, 0, 0});
  p.min_p = 0.2f;  // cut 0.1: keeps all
  ExpectMatchesDistribution(p, logits, {0.5, 0.25, 0.125, 0.125});
}

TEST(SamplerTest, NonFiniteLogitsAreNeverDrawn) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {std::nanf(""), 0.0f, -inf, 0.0f};
  ExpectMatchesDistribution(Plain(1.0f, 5), logits, {0, 0.5, 0, 0.5});
  Sampler s(Plain(1.0f, 5));
  EXPECT_EQ(s.Sample(std::vector<float>{-inf, inf, 0.0f}, {}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{-inf, -inf}, {}), 0);
}

TEST(SamplerTest, RepetitionPenaltyFollowsLlamaCpp) {
  // Positive logits are divided, negative ones multiplied: both get less likely.
  SamplingParams p = Greedy();
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  // Token 0: 3.0 -> 1.5 < 2.0, so token 1 wins once 0 is in the history.
  EXPECT_EQ(s.Sample(std::vector<float>{3.0f, 2.0f}, {}), 0);
  EXPECT_EQ(s.Sample(std::vector<float>{3.0f, 2.0f}, std::vector<int32_t>{0}), 1);
  // Token 0: -1.0 -> -2.0 < -1.5.
  EXPECT_EQ(s.Sample(std::vector<float>{-1.0f, -1.5f}, std::vector<int32_t>{0}), 1);
  // Counted once however often it occurs.
  EXPECT_EQ(s.Sample(std::vector<float>{3.0f, 1.6f}, std::vector<int32_t>{0, 0, 0}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{3.0f, 1.4f}, std::vector<int32_t>{0, 0, 0}), 0);
}

TEST(SamplerTest, PresenceAndFrequencyPenalties) {
  SamplingParams p = Greedy();
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 0.5f;
  Sampler s(p);
  // Token 0 seen 3 times: 5 - 1 - 1.5 = 2.5.
  const std::vector<int32_t> hist = {0, 2, 0, 0};
  EXPECT_EQ(s.Sample(std::vector<float>{5.0f, 2.4f, 0.0f}, hist), 0);
  EXPECT_EQ(s.Sample(std::vector<float>{5.0f, 2.6f, 0.0f}, hist), 1);
  // Token 2 seen once: 3.4 - 1.5 = 1.9 loses to token 1's 2.0.
  EXPECT_EQ(s.Sample(std::vector<float>{0.0f, 2.0f, 3.4f}, hist), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{0.0f, 2.0f, 3.6f}, hist), 2);
}

TEST(SamplerTest, PenaltyWindowCountsOnlyRecentTokens) {
  SamplingParams p = Greedy();
  p.repetition_penalty = 4.0f;
  p.penalty_window = 2;
  Sampler s(p);
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f};
  // Token 0 is outside the last two tokens: unpenalized.
  EXPECT_EQ(s.Sample(logits, std::vector<int32_t>{0, 2, 2}), 0);
  EXPECT_EQ(s.Sample(logits, std::vector<int32_t>{2, 0, 2}), 1);
  // Ids outside the vocabulary in the history are ignored.
  EXPECT_EQ(s.Sample(logits, std::vector<int32_t>{-3, 99}), 0);
  p.penalty_window = 0;
  Sampler off(p);
  EXPECT_EQ(off.Sample(logits, std::vector<int32_t>{0}), 0);
}

TEST(SamplerTest, PenaltiesChangeTheDistribution) {
  // With token 0 penalized to the logit of token 1, both are equally likely.
  SamplingParams p = Plain(1.0f, 77);
  p.repetition_penalty = 2.0f;
  const std::vector<float> logits = {2.0f, 1.0f};
  Sampler s(p);
  int zeros = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) zeros += s.Sample(logits, std::vector<int32_t>{0}) == 0;
  EXPECT_NEAR(zeros, n / 2, 5 * std::sqrt(n / 4.0));
}

TEST(SamplerTest, InvalidParamsDoNotCrash) {
  SamplingParams p;
  p.temperature = std::numeric_limits<float>::quiet_NaN();
  p.top_k = -4;
  p.top_p = std::numeric_limits<float>::quiet_NaN();
  p.min_p = 7.0f;
  p.repetition_penalty = 0.0f;
  p.presence_penalty = std::numeric_limits<float>::infinity();
  p.penalty_window = -3;
  Sampler s(p);
  const int32_t id = s.Sample(std::vector<float>{1.0f, 2.0f, 0.5f}, std::vector<int32_t>{1, 1});
  EXPECT_GE(id, 0);
  EXPECT_LT(id, 3);
  p.temperature = 1e30f;
  p.repetition_penalty = 1e-30f;
  Sampler s2(p);
  const int32_t id2 = s2.Sample(std::vector<float>{1.0f, 2.0f, 0.5f}, std::vector<int32_t>{1});
  EXPECT_GE(id2, 0);
  EXPECT_LT(id2, 3);
}

// Structured output's mask: only allowed ids are ever picked, in every mode; an all-allowed
// mask picks exactly what no mask picks (same seed, same draws).
TEST(SamplerMask, OnlyAllowedTokensAndAllOnesIsNoMask) {
  std::vector<float> logits(64);
  std::mt19937 gen(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (float& l : logits) l = nd(gen);
  std::vector<uint8_t> mask(64, 0);
  for (int i = 5; i < 64; i += 7) mask[i] = 1;
  const std::vector<int32_t> history = {5, 12, 12};
  int32_t best = -1;
  for (int i = 0; i < 64; ++i) {
    if (mask[i] && (best < 0 || logits[i] > logits[best])) best = i;
  }
  Sampler greedy(Greedy());
  EXPECT_EQ(greedy.Sample(logits, {}, mask), best);
  SamplingParams pen = Plain(1.0f, 9);
  pen.repetition_penalty = 1.3f;
  pen.presence_penalty = 0.5f;
  std::vector<SamplingParams> modes = {Plain(1.0f, 1), Plain(0.7f, 2), pen, SamplingParams{}};
  modes.back().seed = 4;
  for (const SamplingParams& p : modes) {
    Sampler masked(p), plain(p), ones(p);
    const std::vector<uint8_t> all(64, 1);
    for (int k = 0; k < 500; ++k) {
      const int32_t t = masked.Sample(logits, history, mask);
      ASSERT_TRUE(t >= 0 && t < 64 && mask[t]) << t;
      ASSERT_EQ(ones.Sample(logits, history, all), plain.Sample(logits, history));
    }
  }
  // A mask shorter than the vocabulary allows nothing past its end.
  Sampler s(Plain(1.0f, 5));
  const std::vector<uint8_t> short_mask = {0, 0, 1};
  for (int k = 0; k < 50; ++k) EXPECT_EQ(s.Sample(logits, {}, short_mask), 2);
}

}  // namespace
}  // namespace thermocline
