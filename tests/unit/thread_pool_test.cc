#include "shared/util/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace thermocline {
namespace {

TEST(ThreadPoolTest, RunCallsEveryThreadOnce) {
  for (int n : {1, 2, 3, 5}) {
    ThreadPool pool(n);
    std::vector<std::atomic<int>> calls(n);
    for (int rep = 0; rep < 200; ++rep) {
      pool.Run([&](int tid, int nth) {
        EXPECT_EQ(nth, n);
        calls[tid].fetch_add(1);
      });
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(calls[i].load(), 200) << "thread " << i;
  }
}

TEST(ThreadPoolTest, ParallelForCoversRangeExactlyOnceOnGrainBoundaries) {
  ThreadPool pool(3);
  for (int64_t n : {1, 7, 64, 1000, 1001}) {
    for (int64_t grain : {1, 4, 16}) {
      std::vector<int> hits(n, 0);
      pool.ParallelFor(
          n,
          [&](int64_t b, int64_t e) {
            EXPECT_TRUE(b % grain == 0) << b;
            for (int64_t i = b; i < e; ++i) hits[i]++;
          },
          grain);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPoolTest, WorkersSleepAndWakeAfterIdle) {
  ThreadPool pool(2);
  std::atomic<int> sum{0};
  pool.Run([&](int, int) { sum.fetch_add(1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // long enough to fall asleep
  pool.Run([&](int, int) { sum.fetch_add(1); });
  EXPECT_EQ(sum.load(), 4);
}

// Shared regions (ParallelFor, RunShared) interleaved with barrier regions (Run), as a decode
// step interleaves them: every piece is claimed exactly once, threads inside one shared region
// have distinct indices (their per-thread scratch), a late worker never runs a region that has
// closed (it would touch a dead closure), and every Run still reaches every thread once.
TEST(ThreadPoolTest, SharedAndBarrierRegionsInterleave) {
  for (int n : {2, 3}) {
    ThreadPool pool(n);
    std::vector<std::atomic<int>> run_calls(n);
    for (int rep = 0; rep < 3000; ++rep) {
      const int64_t items = 1 + rep % 97;
      std::vector<std::atomic<int>> hits(items);
      std::vector<std::atomic<int>> in_use(n);
      std::atomic<int64_t> next{0};
      std::atomic<bool> region_open{true};
      pool.RunShared([&](int tid, int nth) {
        EXPECT_EQ(nth, n);
        EXPECT_TRUE(region_open.load()) << "a closed region ran";
        EXPECT_EQ(in_use[tid].fetch_add(1), 0) << "two threads share index " << tid;
        for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) hits[i]++;
        in_use[tid].fetch_sub(1);
      });
      region_open.store(false);
      for (int64_t i = 0; i < items; ++i) ASSERT_EQ(hits[i].load(), 1) << "rep " << rep;
      std::vector<int> covered(items, 0);
      pool.ParallelFor(items, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) covered[i]++;
      });
      for (int64_t i = 0; i < items; ++i) ASSERT_EQ(covered[i], 1) << "rep " << rep;
      pool.Run([&](int tid, int) { run_calls[tid].fetch_add(1); });
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(run_calls[i].load(), 3000) << "thread " << i;
  }
}

}  // namespace
}  // namespace thermocline
