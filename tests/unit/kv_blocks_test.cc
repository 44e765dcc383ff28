// The prefix cache's bookkeeping (shared/runtime/kv_blocks.h) and the paged KvCache's tables:
// hash-chain reuse of whole blocks only when parent and tokens match, the last prompt token
// always computed, LRU eviction of unreferenced blocks (leaves first), refcounted sharing with
// copy-on-write, forks, the identity layout with the cache off, and refusals of bad ids.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "shared/runtime/kv_blocks.h"
#include "shared/runtime/kv_cache.h"

namespace thermocline {
namespace {

std::vector<int32_t> Tokens(int32_t n, int32_t first) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<BatchEntry> Prefill(int32_t slot, const std::vector<int32_t>& tokens, int32_t from) {
  std::vector<BatchEntry> b;
  for (int32_t p = from; p < static_cast<int32_t>(tokens.size()); ++p) {
    b.push_back({slot, p, tokens[p], false});
  }
  return b;
}

// Prepare + Commit, as a runner does after a successful step.
KvPlan Step(KvBlockManager& m, const std::vector<BatchEntry>& batch) {
  absl::StatusOr<KvPlan> plan = m.Prepare(batch);
  EXPECT_TRUE(plan.ok()) << plan.status();
  m.Commit(batch);
  return plan.ok() ? *plan : KvPlan{};
}

TEST(KvBlocks, ReusesWholeCachedBlocksOfTheSamePrefix) {
  KvBlockManager m(2, 64, 8, true);
  const std::vector<int32_t> a = Tokens(40, 1);
  Step(m, Prefill(0, a, 0));
  const std::vector<int32_t> table0 = m.Table(0, 40).blocks;
  ASSERT_EQ(table0.size(), 3u);
  EXPECT_EQ(m.stats().cached_blocks, 2);  // the two full blocks, not the partial third
  m.Release(0);
  EXPECT_EQ(m.stats().cached_blocks, 2);  // kept after the sequence ended

  std::vector<int32_t> b = a;
  b.resize(36);
  b.push_back(999);  // a different suffix after 36 shared tokens
  EXPECT_EQ(m.AttachPrefix(1, b), 32);
  EXPECT_EQ(m.Table(1, 32).blocks, std::vector<int32_t>(table0.begin(), table0.begin() + 2));
  EXPECT_EQ(m.length(1), 32);
  EXPECT_EQ(m.stats().hit_tokens, 32);
  EXPECT_EQ(m.stats().query_tokens, 37);
  // The suffix goes to a fresh block: nothing is copied, nothing shared is written.
  const KvPlan plan = Step(m, Prefill(1, b, 32));
  EXPECT_TRUE(plan.copies.empty());
  ASSERT_EQ(plan.tables.size(), 1u);
  EXPECT_EQ(plan.tables[0].length, 32);
  ASSERT_EQ(plan.tables[0].blocks.size(), 3u);
  EXPECT_NE(plan.tables[0].blocks[2], table0[0]);
  EXPECT_NE(plan.tables[0].blocks[2], table0[1]);
}

TEST(KvBlocks, MatchesTokensAndParentsNotJustKeys) {
  KvBlockManager m(2, 64, 8, true);
  const std::vector<int32_t> a = Tokens(40, 1);
  Step(m, Prefill(0, a, 0));
  m.Release(0);
  std::vector<int32_t> first_differs = a;
  first_differs[3] = 77;
  EXPECT_EQ(m.AttachPrefix(1, first_differs), 0);
  m.Release(1);
  std::vector<int32_t> second_differs = a;
  second_differs[20] = 77;
  EXPECT_EQ(m.AttachPrefix(1, second_differs), 16);
  m.Release(1);
  // The second block's tokens alone, at the start, are another prefix: no match.
  std::vector<int32_t> shifted(a.begin() + 16, a.end());
  EXPECT_EQ(m.AttachPrefix(1, shifted), 0);
}

TEST(KvBlocks, AlwaysLeavesTheLastPromptTokenToCompute) {
  KvBlockManager m(2, 64, 8, true);
  const std::vector<int32_t> a = Tokens(32, 1);
  Step(m, Prefill(0, a, 0));
  m.Release(0);
  EXPECT_EQ(m.AttachPrefix(1, a), 16);  // both blocks are cached; the second holds the last token
  m.Release(1);
  std::vector<int32_t> longer = a;
  longer.push_back(5);
  EXPECT_EQ(m.AttachPrefix(1, longer), 32);
}

TEST(KvBlocks, EvictsLeastRecentlyUsedUnreferencedBlocksLeavesFirst) {
  // One slot of 4 blocks and no extra: cached blocks live in what the slot does not use.
  KvBlockManager m(1, 64, 0, true);
  const std::vector<int32_t> a = Tokens(33, 1);
  Step(m, Prefill(0, a, 0));
  m.Release(0);  // a0, a1 cached (unreferenced), a2 (partial) free
  EXPECT_EQ(m.stats().cached_blocks, 2);
  EXPECT_EQ(m.free_blocks(), 2);
  const std::vector<int32_t> b = Tokens(33, 500);
  Step(m, Prefill(0, b, 0));  // 3 blocks: the 2 free ones and one evicted, a's tail
  EXPECT_EQ(m.stats().evictions, 1);
  m.Release(0);
  // a's head is still cached; its tail is gone, and so its second block is computed again.
  std::vector<int32_t> a2 = a;
  a2.push_back(7);
  EXPECT_EQ(m.AttachPrefix(0, a2), 16);
}

TEST(KvBlocks, EvictedBlocksAreNotFoundAgain) {
  KvBlockManager m(1, 48, 0, true);  // 3 blocks
  const std::vector<int32_t> a = Tokens(33, 1);
  Step(m, Prefill(0, a, 0));
  m.Release(0);  // a0, a1 cached; a1 older
  // 48 tokens of another prompt take all 3 blocks: both of a's evicted.
  const std::vector<int32_t> b = Tokens(48, 900);
  Step(m, Prefill(0, b, 0));
  EXPECT_EQ(m.stats().evictions, 2);
  m.Release(0);
  EXPECT_EQ(m.AttachPrefix(0, a), 0);
}

TEST(KvBlocks, AnEvictedPrefixIsRegisteredAgainWhenComputedAgain) {
  KvBlockManager m(1, 64, 0, true);  // 4 blocks
  const std::vector<int32_t> a = Tokens(33, 1);
  Step(m, Prefill(0, a, 0));
  m.Release(0);
  // Using the head again makes it the most recent: the tail still goes first.
  std::vector<int32_t> head(a.begin(), a.begin() + 17);
  ASSERT_EQ(m.AttachPrefix(0, head), 16);
  m.Release(0);
  Step(m, Prefill(0, Tokens(49, 700), 0));  // 4 blocks: the 2 free ones and both of a's
  EXPECT_EQ(m.stats().evictions, 2);
  m.Release(0);
  Step(m, Prefill(0, a, 0));
  m.Release(0);
  std::vector<int32_t> a2 = a;
  a2.push_back(9);
  EXPECT_EQ(m.AttachPrefix(0, a2), 32);
}

TEST(KvBlocks, SharedBlocksAreCopiedBeforeTheyAreWritten) {
  KvBlockManager m(2, 64, 8, true);
  const std::vector<int32_t> a = Tokens(40, 1);
  Step(m, Prefill(0, a, 0));
  const std::vector<int32_t> t0 = m.Table(0, 40).blocks;
  EXPECT_EQ(m.AttachPrefix(1, a), 32);
  EXPECT_EQ(m.refs(t0[0]), 2);
  EXPECT_EQ(m.refs(t0[1]), 2);
  // Slot 1 rewinds into the shared second block: it gets a private copy first.
  const std::vector<BatchEntry> rewind = {{1, 20, 42, true}};
  const KvPlan plan = Step(m, rewind);
  ASSERT_EQ(plan.copies.size(), 1u);
  EXPECT_EQ(plan.copies[0].src, t0[1]);
  const std::vector<int32_t> t1 = m.Table(1, 21).blocks;
  ASSERT_EQ(t1.size(), 2u);
  EXPECT_EQ(t1[0], t0[0]);
  EXPECT_EQ(plan.copies[0].dst, t1[1]);
  EXPECT_NE(t1[1], t0[1]);
  EXPECT_EQ(plan.tables[0].length, 20);
  EXPECT_EQ(m.refs(t0[1]), 1);
  EXPECT_EQ(m.length(1), 21);
  // A registered block of the slot's own is not written either (others may attach it).
  const KvPlan own = Step(m, std::vector<BatchEntry>{{0, 3, 8, true}});
  ASSERT_EQ(own.copies.size(), 1u);
  EXPECT_EQ(own.copies[0].src, t0[0]);
}

TEST(KvBlocks, ForkSharesFullBlocksAndCopiesThePartialOne) {
  KvBlockManager m(3, 64, 8, true);
  const std::vector<int32_t> a = Tokens(20, 1);
  Step(m, Prefill(0, a, 0));
  const std::vector<int32_t> t0 = m.Table(0, 20).blocks;
  ASSERT_TRUE(m.Fork(0, 1, 20).ok());
  ASSERT_TRUE(m.Fork(0, 2, 20).ok());
  EXPECT_EQ(m.refs(t0[0]), 3);
  EXPECT_EQ(m.tokens(1), a);
  const std::vector<int32_t> t1 = m.Table(1, 20).blocks, t2 = m.Table(2, 20).blocks;
  EXPECT_EQ(t1[0], t0[0]);
  EXPECT_NE(t1[1], t0[1]);
  EXPECT_NE(t2[1], t1[1]);
  // The next step copies the partial block before any of the three writes position 20.
  const KvPlan plan = Step(m, std::vector<BatchEntry>{{0, 20, 5, true}, {1, 20, 6, true}, {2, 20, 7, true}});
  ASSERT_EQ(plan.copies.size(), 2u);
  EXPECT_EQ(plan.copies[0].src, t0[1]);
  EXPECT_EQ(plan.copies[0].dst, t1[1]);
  EXPECT_EQ(plan.copies[1].dst, t2[1]);
  EXPECT_FALSE(m.Fork(0, 1, 20).ok());  // slot 1 is not empty
  EXPECT_FALSE(m.Fork(0, 0, 5).ok());
}

TEST(KvBlocks, OffMeansTheIdentityLayoutAndNoSharing) {
  KvBlockManager m(2, 40, 0, false);  // 3 blocks per slot
  const std::vector<int32_t> a = Tokens(40, 1);
  Step(m, Prefill(1, a, 0));
  EXPECT_EQ(m.Table(1, 40).blocks, (std::vector<int32_t>{3, 4, 5}));
  m.Release(1);
  EXPECT_EQ(m.AttachPrefix(0, a), 0);
  EXPECT_EQ(m.stats().cached_blocks, 0);
  EXPECT_EQ(m.stats().query_tokens, 0);
  EXPECT_FALSE(m.Fork(1, 0, 1).ok());
}

TEST(KvBlocks, RefusesPositionsPastTheSlotAndTheCapacity) {
  KvBlockManager m(1, 20, 0, true);
  EXPECT_FALSE(m.Prepare(std::vector<BatchEntry>{{0, 1, 3, true}}).ok());   // skips position 0
  EXPECT_FALSE(m.Prepare(std::vector<BatchEntry>{{1, 0, 3, true}}).ok());   // no slot 1
  Step(m, Prefill(0, Tokens(20, 1), 0));
  EXPECT_FALSE(m.Prepare(std::vector<BatchEntry>{{0, 20, 3, true}}).ok());  // capacity
}

TEST(KvCacheTables, ApplyChecksEveryIdBeforeChangingAnything) {
  ModelConfig c;
  c.n_layers = 2;
  c.kv_dim = 4;
  c.context_length = 64;
  auto kv = KvCache::Create(c, 2, 40, GgmlType::kF32, 2);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->n_blocks(), 2 * 3 + 2);
  const std::vector<KvSlotTable> bad_block = {{0, 0, {1, 8}}};
  absl::Status s = kv->Apply(bad_block, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block 8"), std::string::npos) << s;
  EXPECT_EQ(kv->block(0, 16), 1);  // unchanged: the identity table
  EXPECT_FALSE(kv->Apply(std::vector<KvSlotTable>{{2, 0, {0}}}, {}).ok());         // slot
  EXPECT_FALSE(kv->Apply(std::vector<KvSlotTable>{{0, 17, {0}}}, {}).ok());        // length
  EXPECT_FALSE(kv->Apply(std::vector<KvSlotTable>{{0, 0, {0, 1, 2, 3}}}, {}).ok());  // too long
  EXPECT_FALSE(kv->Apply({}, std::vector<KvBlockCopy>{{7, 7}}).ok());
  EXPECT_FALSE(kv->Apply({}, std::vector<KvBlockCopy>{{-1, 2}}).ok());

  // A copy moves every layer's keys and values of the block; a table remaps positions.
  const float k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
  kv->Store(1, 0, 3, k, v);  // slot 0, block 0
  ASSERT_TRUE(kv->Apply(std::vector<KvSlotTable>{{1, 4, {7}}},
                        std::vector<KvBlockCopy>{{0, 7}})
                  .ok());
  EXPECT_EQ(kv->length(1), 4);
  EXPECT_EQ(kv->mapped(1), 16);
  EXPECT_EQ(kv->block(1, 3), 7);
  EXPECT_EQ(reinterpret_cast<const float*>(kv->key(1, 1, 3))[2], 3.0f);
  EXPECT_EQ(reinterpret_cast<const float*>(kv->value(1, 1, 3))[3], 8.0f);
  kv->Reset(1);
  EXPECT_EQ(kv->block(1, 3), 3);
  EXPECT_EQ(kv->mapped(1), 48);
}

}  // namespace
}  // namespace thermocline
