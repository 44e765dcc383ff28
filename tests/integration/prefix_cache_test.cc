// The prefix cache in one process (shared/runtime/paged_runner.h) on stories260K: a prompt
// whose prefix is cached, and three forks of one prefilled prompt, give logits bit for bit
// equal to cold runs on the contiguous cache (ForwardPassRunner), since the same keys and values
// are read in the same order, only from other blocks.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"
#include "shared/runtime/paged_runner.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

constexpr int64_t kContext = 128;

std::vector<int32_t> Prompt(int n, int variant) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 37 + (i >= 40 ? variant * 101 : 0)) % 500);
  return t;
}

// Runs `tokens` in `slot` from position `from` (chunks of 8), then feeds `forced` one at a
// time; returns every logits row (the last prompt position's, then one per forced token).
std::vector<std::vector<float>> Drive(BatchRunner& r, int32_t slot, const std::vector<int32_t>& tokens,
                                      int32_t from, const std::vector<int32_t>& forced) {
  std::vector<std::vector<float>> rows;
  std::vector<float> logits;
  const int32_t n = static_cast<int32_t>(tokens.size());
  for (int32_t p = from; p < n; p += 8) {
    std::vector<BatchEntry> b;
    for (int32_t q = p; q < std::min(n, p + 8); ++q) b.push_back({slot, q, tokens[q], q == n - 1});
    EXPECT_TRUE(r.Run(b, logits).ok());
  }
  rows.push_back(logits);
  for (size_t i = 0; i < forced.size(); ++i) {
    const BatchEntry e{slot, n + static_cast<int32_t>(i), forced[i], true};
    EXPECT_TRUE(r.Run(std::span<const BatchEntry>(&e, 1), logits).ok());
    rows.push_back(logits);
  }
  return rows;
}

bool BitEqual(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || a[i].empty() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

class PrefixCache : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::Load(testing::ModelPath("stories260K/stories260K.gguf"));
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  // A cold run of tokens + forced on a fresh contiguous cache.
  std::vector<std::vector<float>> Cold(const std::vector<int32_t>& tokens,
                                       const std::vector<int32_t>& forced) {
    auto kv = KvCache::Create(model_->config(), 1, kContext, GgmlType::kF32);
    EXPECT_TRUE(kv.ok());
    ForwardPass pass(*model_, *kv, pool_);
    ForwardPassRunner r(pass);
    return Drive(r, 0, tokens, 0, forced);
  }
  std::unique_ptr<Model> model_;
  ThreadPool pool_{1};
};

TEST_F(PrefixCache, CachedPrefixGivesTheColdLogitsBitForBit) {
  auto kv = KvCache::Create(model_->config(), 2, kContext, GgmlType::kF32, 8);
  ASSERT_TRUE(kv.ok());
  ForwardPass pass(*model_, *kv, pool_);
  PagedForwardRunner r(pass, 8, true);
  const std::vector<int32_t> a = Prompt(60, 1), b = Prompt(57, 2), forced = {5, 9, 200, 31};
  const auto first = Drive(r, 0, a, r.ReusePrefix(0, a), forced);
  r.ResetSlot(0);
  EXPECT_TRUE(BitEqual(first, Cold(a, forced)));
  // b shares a's first 40 tokens: 2 whole blocks come from the cache (in slot 1 this time).
  const int32_t reused = r.ReusePrefix(1, b);
  EXPECT_EQ(reused, 32);
  EXPECT_TRUE(BitEqual(Drive(r, 1, b, reused, forced), Cold(b, forced)));
  EXPECT_EQ(r.prefix_cache_stats().hit_tokens, 32);
}

TEST_F(PrefixCache, ForksOfOnePromptMatchIndependentRuns) {
  auto kv = KvCache::Create(model_->config(), 3, kContext, GgmlType::kF32, 8);
  ASSERT_TRUE(kv.ok());
  ForwardPass pass(*model_, *kv, pool_);
  PagedForwardRunner r(pass, 8, true);
  const std::vector<int32_t> p = Prompt(37, 0);  // 2 whole blocks and 5 positions
  const auto prompt_rows = Drive(r, 0, p, 0, {});
  ASSERT_TRUE(r.ForkSlot(0, 1, 37).ok());
  ASSERT_TRUE(r.ForkSlot(0, 2, 37).ok());
  // Each continues with its own tokens, in one batch, as n > 1 choices decode.
  const std::vector<std::vector<int32_t>> forced = {{4, 8, 15}, {16, 23, 42}, {100, 7, 7}};
  std::vector<std::vector<std::vector<float>>> got(3, prompt_rows);
  std::vector<float> logits;
  const int64_t vocab = model_->config().vocab_size;
  for (int i = 0; i < 3; ++i) {
    std::vector<BatchEntry> b;
    for (int32_t s = 0; s < 3; ++s) b.push_back({s, 37 + i, forced[s][i], true});
    ASSERT_TRUE(r.Run(b, logits).ok());
    for (int32_t s = 0; s < 3; ++s) {
      got[s].emplace_back(logits.begin() + s * vocab, logits.begin() + (s + 1) * vocab);
    }
  }
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(BitEqual(got[s], Cold(p, forced[s]))) << "fork " << s;
}

}  // namespace
}  // namespace thermocline
