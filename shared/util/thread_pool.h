// A fixed pool of worker threads for fork-join kernels.
//
// A decode step runs hundreds of small parallel regions, so workers spin briefly on a
// generation counter before sleeping (std::atomic::wait, a futex on Linux): waking a sleeping
// thread costs tens of microseconds, which would dominate small models.
//
// Run is a barrier: every thread runs fn once, so each region waits for the slowest thread,
// and on a busy machine a worker that is not scheduled stalls the region for a whole time
// slice. ParallelFor is not: its range is cut into a few pieces per thread that whoever is
// running claims, the caller included, and a worker that wakes after every piece is claimed
// skips the region instead of being waited for.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace thermocline {

class ThreadPool {
 public:
  // `n_threads` counts the calling thread; 1 means everything runs on the caller.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index, n_threads) once on every thread (the caller is index 0) and returns
  // when all calls have returned. Not reentrant: fn must not call Run on the same pool.
  void Run(const std::function<void(int, int)>& fn);

  // Cuts [0, n) into contiguous pieces, each a multiple of `grain` except the last, and calls
  // fn(begin, end) once per piece, on whichever threads claim them (the pieces, hence every
  // result that depends only on its own range, do not depend on who runs them).
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  // A region whose work is claimed, not assigned: fn(thread_index, n_threads) runs on the
  // caller and on every worker that joins before the caller's call returns, each with its own
  // index (for per-thread scratch); fn must take its work from a shared counter until none is
  // left, since any subset of the threads may run it. Returns once no call is in progress.
  void RunShared(const std::function<void(int, int)>& fn);

 private:
  void WorkerLoop(int index);

  const int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  // Bumped by 2 per region; the low bit says whether it is a shared (ParallelFor) region, so
  // that one load gives a worker both.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // Run: workers that have not finished
  // Shared regions: the last one closed to late workers, and the workers inside fn.
  std::atomic<uint64_t> closed_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace thermocline
