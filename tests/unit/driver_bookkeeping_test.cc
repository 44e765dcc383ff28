// The split driver's pure bookkeeping: the restart budget and its backoff (with an injected
// clock), and the per-slot history that a restarted gpu_worker is rebuilt from.
#include <vector>

#include "gtest/gtest.h"
#include "shared/driver/restart_budget.h"
#include "shared/driver/slot_history.h"

namespace thermocline::driver {
namespace {

using ipc::StepEntry;

TEST(RestartBudget, BackoffDoublesUpToTheCapAndTheWindowRefusesTheSixth) {
  RestartPolicy p;
  p.max_restarts = 5;
  p.window = absl::Minutes(1);
  p.initial_backoff = absl::ZeroDuration();
  p.backoff_step = absl::Milliseconds(100);
  p.max_backoff = absl::Milliseconds(300);
  RestartBudget b(p);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::vector<absl::Duration> want = {absl::ZeroDuration(), absl::Milliseconds(100),
                                            absl::Milliseconds(200), absl::Milliseconds(300),
                                            absl::Milliseconds(300)};
  for (size_t i = 0; i < want.size(); ++i) {
    auto d = b.Next(t0 + absl::Seconds(i));
    ASSERT_TRUE(d.ok()) << i << ": " << d.status();
    EXPECT_EQ(*d, want[i]) << "restart " << i;
  }
  auto refused = b.Next(t0 + absl::Seconds(10));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("5 restarts within 1m"), std::string::npos)
      << refused.status();
  EXPECT_EQ(b.total(), 5);  // the refused one is not counted
  EXPECT_EQ(b.RecentRestarts(t0 + absl::Seconds(10)), 5);
}

TEST(RestartBudget, OldRestartsLeaveTheWindowAndTheBackoffRecovers) {
  RestartPolicy p;
  p.max_restarts = 2;
  p.window = absl::Seconds(10);
  RestartBudget b(p);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(b.Next(t0).ok());
  ASSERT_TRUE(b.Next(t0 + absl::Seconds(1)).ok());
  EXPECT_FALSE(b.Next(t0 + absl::Seconds(9)).ok());
  // At t0+10 the first restart has left the window: one slot free, second-in-window backoff.
  auto d = b.Next(t0 + absl::Seconds(10));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, p.backoff_step);
  // A quiet minute later the budget is whole again and the first restart is immediate.
  auto fresh = b.Next(t0 + absl::Seconds(100));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*fresh, p.initial_backoff);
  EXPECT_EQ(b.total(), 4);
}

TEST(SlotHistory, RecordsAppendsAndRewindsLikeTheKvCache) {
  SlotHistory h(3, 16);
  const std::vector<StepEntry> prompt = {{1, 0, 10, 0}, {1, 1, 11, 0}, {1, 2, 12, 1}};
  ASSERT_TRUE(h.Validate(prompt).ok());
  h.Apply(prompt);
  const std::vector<StepEntry> decode = {{1, 3, 13, 1}, {0, 0, 5, 1}};
  ASSERT_TRUE(h.Validate(decode).ok());
  h.Apply(decode);
  EXPECT_EQ(h.tokens(1), (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(h.tokens(0), (std::vector<int32_t>{5}));
  // Rewind slot 1 to position 2: positions 2.. are replaced, as ForwardPass's length is.
  const std::vector<StepEntry> rewind = {{1, 2, 20, 1}};
  ASSERT_TRUE(h.Validate(rewind).ok());
  h.Apply(rewind);
  EXPECT_EQ(h.tokens(1), (std::vector<int32_t>{10, 11, 20}));
  EXPECT_EQ(h.total_tokens(), 4);
  h.Release(1);
  EXPECT_TRUE(h.tokens(1).empty());
  EXPECT_EQ(h.total_tokens(), 1);
}

TEST(SlotHistory, ValidateRefusesGapsBadSlotsAndPositionsPastTheContext) {
  SlotHistory h(2, 4);
  h.Apply(std::vector<StepEntry>{{0, 0, 1, 0}});
  // Within one step a slot's entries continue each other.
  EXPECT_TRUE(h.Validate(std::vector<StepEntry>{{0, 1, 2, 0}, {0, 2, 3, 0}}).ok());
  auto gap = h.Validate(std::vector<StepEntry>{{0, 1, 2, 0}, {0, 3, 3, 0}});
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gap.message().find("entry 1: position 3 of slot 0, which holds 2"), std::string::npos)
      << gap;
  EXPECT_FALSE(h.Validate(std::vector<StepEntry>{{1, 1, 0, 0}}).ok());   // slot 1 is empty
  EXPECT_FALSE(h.Validate(std::vector<StepEntry>{{2, 0, 0, 0}}).ok());   // no slot 2
  EXPECT_FALSE(h.Validate(std::vector<StepEntry>{{-1, 0, 0, 0}}).ok());
  EXPECT_FALSE(h.Validate(std::vector<StepEntry>{{0, 4, 0, 0}}).ok());   // context is 4
  EXPECT_FALSE(h.Validate(std::vector<StepEntry>{{0, -1, 0, 0}}).ok());
}

TEST(SlotHistory, ReplayRebuildsEverySlotInChunksWithoutLogits) {
  SlotHistory h(4, 64);
  std::vector<StepEntry> a, b;
  for (int p = 0; p < 5; ++p) a.push_back({0, p, 100 + p, 0});
  for (int p = 0; p < 3; ++p) b.push_back({2, p, 200 + p, 0});
  h.Apply(a);
  h.Apply(b);
  const auto steps = h.ReplaySteps(3);
  ASSERT_EQ(steps.size(), 3u);  // 8 tokens in steps of at most 3
  std::vector<StepEntry> flat;
  for (const auto& s : steps) {
    EXPECT_LE(s.size(), 3u);
    flat.insert(flat.end(), s.begin(), s.end());
  }
  ASSERT_EQ(flat.size(), 8u);
  for (size_t i = 0; i < flat.size(); ++i) {
    const StepEntry& e = flat[i];
    const StepEntry& want = i < 5 ? a[i] : b[i - 5];
    EXPECT_EQ(e.kv_slot, want.kv_slot);
    EXPECT_EQ(e.position, want.position);
    EXPECT_EQ(e.token_id, want.token_id);
    EXPECT_EQ(e.flags, 0u) << "a replay wants no logits";
  }
  // Replaying into a fresh history validates step by step: the steps are a valid schedule.
  SlotHistory fresh(4, 64);
  for (const auto& s : steps) {
    ASSERT_TRUE(fresh.Validate(s).ok());
    fresh.Apply(s);
  }
  EXPECT_EQ(fresh.tokens(0), h.tokens(0));
  EXPECT_EQ(fresh.tokens(2), h.tokens(2));
  EXPECT_TRUE(SlotHistory(2, 8).ReplaySteps(4).empty());
}

}  // namespace
}  // namespace thermocline::driver
