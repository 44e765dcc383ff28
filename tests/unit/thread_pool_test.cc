#include "shared/util/thread_pool.h"

#include <atomic>
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

}  // namespace
}  // namespace thermocline
