#include "shared/util/thread_pool.h"

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/util/load_average.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

// Threads that keep every core busy for the lifetime of the object, so that a pool with more
// threads than cores runs with its workers descheduled at random points.
class Burners {
 public:
  explicit Burners(int n = 2 * UsableCpus()) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        uint64_t x = 1;
        while (!stop_.load(std::memory_order_relaxed)) x = x * 6364136223846793005ull + 1;
        sink_.fetch_add(x, std::memory_order_relaxed);
      });
    }
  }
  ~Burners() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sink_{0};
  std::vector<std::thread> threads_;
};

// More threads than this machine has cores, as on a busy server.
std::vector<int> ThreadCounts() { return {1, 2, 3, 8}; }

TEST(ThreadPoolTest, RunCallsEveryThreadOnce) {
  Burners burn;
  for (int n : ThreadCounts()) {
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

// Every piece runs exactly once, pieces running at the same time have different thread indices
// (their scratch), every index is in range, and the region is over when the call returns.
TEST(ThreadPoolTest, ForEachPieceRunsEveryPieceOnceUnderLoad) {
  Burners burn;
  for (int n : ThreadCounts()) {
    ThreadPool pool(n);
    for (int rep = 0; rep < 2000; ++rep) {
      const int64_t pieces = 1 + rep % 53;
      std::vector<std::atomic<int>> hits(pieces);
      std::vector<std::atomic<int>> in_use(n);
      std::atomic<bool> open{true};
      pool.ForEachPiece(pieces, [&](int tid, int64_t p) {
        ASSERT_GE(tid, 0);
        ASSERT_LT(tid, n);
        EXPECT_TRUE(open.load()) << "a piece ran after its region returned";
        EXPECT_EQ(in_use[tid].fetch_add(1), 0) << "two threads share index " << tid;
        hits[p].fetch_add(1);
        in_use[tid].fetch_sub(1);
      });
      open.store(false);
      for (int64_t p = 0; p < pieces; ++p) {
        ASSERT_EQ(hits[p].load(), 1) << "threads=" << n << " rep=" << rep << " piece=" << p;
      }
    }
  }
}

// Workers do take pieces: whichever thread claims one of two pieces first waits inside it
// until the other piece has run, which only another thread can do (no timing involved).
TEST(ThreadPoolTest, WorkersClaimPiecesTheCallerLeaves) {
  Burners burn;
  for (int n : {2, 3, 8}) {
    ThreadPool pool(n);
    for (int rep = 0; rep < 20; ++rep) {
      std::atomic<int> first{-1};
      std::atomic<bool> second_ran{false};
      std::vector<std::thread::id> ran_on(2);
      std::vector<int> tids(2);
      pool.ForEachPiece(2, [&](int tid, int64_t p) {
        ran_on[p] = std::this_thread::get_id();
        tids[p] = tid;
        int expected = -1;
        if (first.compare_exchange_strong(expected, static_cast<int>(p))) {
          while (!second_ran.load()) std::this_thread::yield();
        } else {
          second_ran.store(true);
        }
      });
      EXPECT_NE(ran_on[0], ran_on[1]) << "threads=" << n;
      EXPECT_NE(tids[0], tids[1]) << "threads=" << n;
    }
    EXPECT_GE(pool.pieces_run_by_workers(), 20) << "threads=" << n;
  }
}

TEST(ThreadPoolTest, ParallelForCoversRangeExactlyOnceOnGrainBoundaries) {
  Burners burn;
  for (int n : ThreadCounts()) {
    ThreadPool pool(n);
    for (int64_t len : {1, 7, 64, 1000, 1001}) {
      for (int64_t grain : {1, 4, 16}) {
        std::vector<std::atomic<int>> hits(len);
        pool.ParallelFor(
            len,
            [&](int64_t b, int64_t e) {
              EXPECT_TRUE(b % grain == 0) << b;
              for (int64_t i = b; i < e; ++i) hits[i]++;
            },
            grain);
        for (int64_t i = 0; i < len; ++i) {
          ASSERT_EQ(hits[i].load(), 1) << "threads=" << n << " n=" << len << " i=" << i;
        }
      }
    }
  }
}

// The guided cut: pieces cover [0, chunks) in order, never grow, start at the range over
// 2 x threads, and stay few: no piece is under chunks / (64 x threads) but the last, so there
// are at most about 2 x threads x (ln 32 + 1), some 9 per thread, however large the range
// (measured here: up to 11 with the integer rounding).
TEST(ThreadPoolTest, GuidedCutShrinksAndStaysFew) {
  for (int threads : {2, 3, 8, 16}) {
    for (int64_t chunks : {1, 2, 5, 31, 64, 512, 1000, 4097, 1000000, 10000000}) {
      ThreadPool::Cut starts;
      ThreadPool::GuidedCut(chunks, threads, starts);
      SCOPED_TRACE(::testing::Message() << "threads=" << threads << " chunks=" << chunks);
      ASSERT_GE(starts.size(), 2u);
      EXPECT_EQ(starts.front(), 0);
      EXPECT_EQ(starts.back(), chunks);
      const int64_t pieces = static_cast<int64_t>(starts.size()) - 1;
      EXPECT_LE(pieces, 12 * threads);
      EXPECT_EQ(starts[1], std::min(chunks, std::max<int64_t>(1, chunks / (2 * threads))));
      const int64_t least = std::max<int64_t>(1, chunks / (64 * threads));
      for (int64_t p = 0; p < pieces; ++p) {
        const int64_t size = starts[p + 1] - starts[p];
        ASSERT_GE(size, 1) << "piece " << p;
        if (p > 0) {
          EXPECT_LE(size, starts[p] - starts[p - 1]) << "piece " << p << " grew";
        }
        if (p + 1 < pieces) {
          EXPECT_GE(size, least) << "piece " << p;
        }
      }
      // The tail is short: the last piece is the smallest size, or what was left of it.
      EXPECT_LE(starts[pieces] - starts[pieces - 1], least) << "last piece";
    }
  }
}

// Below the cost threshold nothing is woken: every call runs on the calling thread and no
// worker runs a piece. Above it, pieces carry at least kMinPieceBytes and start on `align`.
TEST(ThreadPoolTest, SmallWorkRunsOnTheCaller) {
  ThreadPool pool(4);
  const std::thread::id me = std::this_thread::get_id();
  const int64_t before = pool.pieces_run_by_workers();
  const int64_t item_bytes = 512;
  const int64_t small = ThreadPool::kMinParallelBytes / item_bytes - 1;
  for (int rep = 0; rep < 500; ++rep) {
    int calls = 0;
    pool.ParallelForBytes(small, item_bytes, [&](int64_t b, int64_t e) {
      EXPECT_EQ(std::this_thread::get_id(), me);
      EXPECT_EQ(b, 0);
      EXPECT_EQ(e, small);
      ++calls;
    });
    EXPECT_EQ(calls, 1);
    pool.ForEachPieceBytes(8, ThreadPool::kMinParallelBytes - 1, [&](int tid, int64_t) {
      EXPECT_EQ(tid, 0);
      EXPECT_EQ(std::this_thread::get_id(), me);
    });
  }
  EXPECT_EQ(pool.pieces_run_by_workers(), before);

  const int64_t big = 64 * ThreadPool::kMinParallelBytes / item_bytes + 5;
  const int64_t align = 16;
  const int64_t grain = ThreadPool::GrainForBytes(item_bytes, align);
  EXPECT_EQ(grain % align, 0);
  EXPECT_GE(grain * item_bytes, ThreadPool::kMinPieceBytes);
  std::vector<std::atomic<int>> hits(big);
  pool.ParallelForBytes(
      big, item_bytes,
      [&](int64_t b, int64_t e) {
        EXPECT_EQ(b % grain, 0);
        EXPECT_TRUE(e == big || (e - b) % grain == 0);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      },
      align);
  for (int64_t i = 0; i < big; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

// A region started from inside a region of the same pool (on the caller or on a worker) runs
// on that thread alone, completely, instead of deadlocking on the busy threads; a region of
// another pool (one per thread index: a pool takes one caller at a time) inside it runs
// normally.
TEST(ThreadPoolTest, NestedRegionsRunOnTheCallingThread) {
  Burners burn;
  for (int n : {2, 3, 8}) {
    ThreadPool pool(n);
    std::vector<std::unique_ptr<ThreadPool>> others;
    for (int i = 0; i < n; ++i) others.push_back(std::make_unique<ThreadPool>(2));
    for (int rep = 0; rep < 200; ++rep) {
      const int64_t outer = 1 + rep % 11, inner = 1 + rep % 29;
      std::vector<std::atomic<int>> hits(outer * inner), other_hits(outer * inner);
      std::vector<std::atomic<int>> run_calls(outer * n);
      pool.ForEachPiece(outer, [&](int outer_tid, int64_t p) {
        const std::thread::id me = std::this_thread::get_id();
        pool.ParallelFor(inner, [&](int64_t b, int64_t e) {
          EXPECT_EQ(std::this_thread::get_id(), me);
          for (int64_t i = b; i < e; ++i) hits[p * inner + i]++;
        });
        pool.ForEachPiece(inner, [&](int tid, int64_t) {
          EXPECT_EQ(std::this_thread::get_id(), me);
          EXPECT_EQ(tid, 0);
        });
        pool.Run([&](int tid, int nth) {
          EXPECT_EQ(std::this_thread::get_id(), me);
          EXPECT_EQ(nth, n);
          run_calls[p * n + tid]++;
        });
        others[outer_tid]->ParallelFor(inner, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) other_hits[p * inner + i]++;
        });
      });
      for (int64_t i = 0; i < outer * inner; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " rep=" << rep << " i=" << i;
        ASSERT_EQ(other_hits[i].load(), 1) << "n=" << n << " rep=" << rep << " i=" << i;
      }
      for (int64_t i = 0; i < outer * n; ++i) ASSERT_EQ(run_calls[i].load(), 1);
    }
  }
}

// Claimed regions interleaved with barrier regions, as a decode step may interleave them.
TEST(ThreadPoolTest, ClaimedAndBarrierRegionsInterleave) {
  Burners burn;
  for (int n : {2, 3, 8}) {
    ThreadPool pool(n);
    std::vector<std::atomic<int>> run_calls(n);
    // Barriers with 8 threads on a busy 2-core machine wait for time slices: fewer rounds.
    const int reps = n > 3 ? 100 : 300;
    for (int rep = 0; rep < reps; ++rep) {
      const int64_t items = 1 + rep % 97;
      std::vector<std::atomic<int>> hits(items);
      pool.ForEachPiece(items, [&](int, int64_t i) { hits[i]++; });
      for (int64_t i = 0; i < items; ++i) ASSERT_EQ(hits[i].load(), 1) << "rep " << rep;
      std::vector<int> covered(items, 0);
      pool.ParallelFor(items, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) covered[i]++;
      });
      for (int64_t i = 0; i < items; ++i) ASSERT_EQ(covered[i], 1) << "rep " << rep;
      pool.Run([&](int tid, int) { run_calls[tid].fetch_add(1); });
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(run_calls[i].load(), reps) << "thread " << i;
  }
}

// The scheduler's state of every pool worker of this process ('R' running, 'S' sleeping,
// ...), from /proc/self/task/*/stat; workers are the threads named "tc-pool".
std::vector<char> PoolThreadStates() {
  std::vector<char> states;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return states;
  while (dirent* d = readdir(dir)) {
    if (d->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + d->d_name;
    std::ifstream comm(task + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name != "tc-pool") continue;
    std::ifstream stat(task + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size()) states.push_back(line[close + 2]);
  }
  closedir(dir);
  return states;
}

// Spinning is bounded: once regions stop coming, every worker goes to sleep (the state the
// kernel reports, polled with a generous cap, not a timing), and wakes for the next region.
TEST(ThreadPoolTest, IdleWorkersSleepAndWakeForTheNextRegion) {
  ThreadPool pool(4);
  std::atomic<int> sum{0};
  pool.Run([&](int, int) { sum.fetch_add(1); });
  std::vector<std::atomic<int>> hits(64);
  pool.ForEachPiece(64, [&](int, int64_t p) { hits[p]++; });
  bool all_asleep = false;
  for (int poll = 0; poll < 1000 && !all_asleep; ++poll) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const std::vector<char> states = PoolThreadStates();
    ASSERT_EQ(states.size(), 3u);
    all_asleep = true;
    for (char s : states) all_asleep &= s == 'S';
  }
  EXPECT_TRUE(all_asleep) << "a worker kept running with no work for 10 s";
  pool.Run([&](int, int) { sum.fetch_add(1); });
  EXPECT_EQ(sum.load(), 8);
  for (int p = 0; p < 64; ++p) EXPECT_EQ(hits[p].load(), 1);
}

// The decode path gives the same bits at every thread count, with more threads than cores
// and the cores busy: every region's result depends on its piece, never on who ran it.
TEST(ThreadPoolTest, ForwardPassIsBitIdenticalAcrossThreadCountsUnderLoad) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  auto model = Model::Load(testing::ModelPath("stories260K/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  Burners burn;
  std::vector<std::vector<float>> runs;
  for (int n : ThreadCounts()) {
    auto kv = KvCache::Create(c, 1, 64, GgmlType::kF32);
    ASSERT_TRUE(kv.ok()) << kv.status();
    ThreadPool pool(n);
    ForwardPass pass(**model, *kv, pool);
    std::vector<BatchEntry> prompt;
    for (int p = 0; p < 16; ++p) prompt.push_back({0, p, 3 + 7 * p, true});
    std::vector<float> logits, all;
    ASSERT_TRUE(pass.Run(prompt, logits).ok());
    all = logits;
    for (int i = 0; i < 24; ++i) {
      BatchEntry e{0, 16 + i, 5 + 11 * i, true};
      ASSERT_TRUE(pass.Run(std::span<const BatchEntry>(&e, 1), logits).ok());
      all.insert(all.end(), logits.begin(), logits.end());
    }
    runs.push_back(std::move(all));
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].size(), runs[0].size());
    EXPECT_EQ(std::memcmp(runs[i].data(), runs[0].data(), runs[0].size() * sizeof(float)), 0)
        << "threads=" << ThreadCounts()[i] << " differs from 1 thread";
  }
}

TEST(LoadAverageTest, ParsesTheKernelsFormat) {
  absl::StatusOr<LoadAverage> l = ParseLoadAverage("7.25 3.50 1.05 9/311 12345\n");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->one, 7.25);
  EXPECT_EQ(l->five, 3.5);
  EXPECT_EQ(l->fifteen, 1.05);
  EXPECT_EQ(l->runnable, 9);
  EXPECT_EQ(l->total, 311);
  EXPECT_TRUE(Oversubscribed(*l, 2));
  EXPECT_FALSE(Oversubscribed(*l, 16));
  EXPECT_TRUE(Oversubscribed(LoadAverage{0.5, 0, 0, 3, 10}, 2));  // runnable now, average low
  EXPECT_TRUE(Oversubscribed(LoadAverage{2.6, 0, 0, 1, 10}, 2));  // average high
  EXPECT_FALSE(Oversubscribed(LoadAverage{2.0, 0, 0, 2, 10}, 2));
  // Our own two busy threads and a little background: still spin.
  EXPECT_FALSE(Oversubscribed(LoadAverage{2.4, 0, 0, 2, 10}, 2));
  // The live file parses.
  EXPECT_TRUE(ReadLoadAverage().ok()) << ReadLoadAverage().status();
  EXPECT_GE(UsableCpus(), 1);
}

TEST(LoadAverageTest, RejectsMalformedTextNamingTheField) {
  struct Case {
    const char* text;
    const char* error;
  };
  for (const Case& c : {Case{"", "expected 5 fields, got 0"},
                        Case{"1.0 2.0 3.0", "expected 5 fields, got 3"},
                        Case{"x 2.0 3.0 1/2 5", "bad 1-minute average 'x'"},
                        Case{"1.0 -2 3.0 1/2 5", "bad 5-minute average '-2'"},
                        Case{"1.0 2.0 nan 1/2 5", "bad 15-minute average 'nan'"},
                        Case{"1.0 2.0 3.0 12 5", "bad runnable/total field '12'"},
                        Case{"1.0 2.0 3.0 5/2 5", "bad runnable/total field '5/2'"},
                        Case{"1.0 2.0 3.0 a/2 5", "bad runnable/total field 'a/2'"}}) {
    absl::StatusOr<LoadAverage> l = ParseLoadAverage(c.text);
    ASSERT_FALSE(l.ok()) << c.text;
    EXPECT_NE(std::string(l.status().message()).find(c.error), std::string::npos)
        << l.status() << " for '" << c.text << "'";
  }
}

}  // namespace
}  // namespace thermocline
