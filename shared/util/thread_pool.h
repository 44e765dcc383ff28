// A fixed pool of worker threads for fork-join kernels.
//
// A decode step runs hundreds of small parallel regions, so workers spin briefly on a
// generation counter before sleeping (std::atomic::wait, a futex on Linux): waking a sleeping
// thread costs tens of microseconds, which would dominate small models.
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

  // Splits [0, n) into one contiguous range per thread, each a multiple of `grain` except the
  // last, and calls fn(begin, end) for the non-empty ones.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

 private:
  void WorkerLoop(int index);

  const int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace thermocline
