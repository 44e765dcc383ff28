#include "shared/util/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TC_CPU_RELAX() _mm_pause()
#else
#define TC_CPU_RELAX() \
  do {                 \
  } while (0)
#endif

namespace thermocline {
namespace {
// About 20-50 us of spinning before a worker sleeps: longer than the gap between two kernels
// of one step, much shorter than the gap between two steps of an idle server.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0, n_threads_);
  for (int spins = 0;; ++spins) {
    int left = pending_.load(std::memory_order_acquire);
    if (left == 0) break;
    if (spins < kSpinIterations) {
      TC_CPU_RELAX();
    } else {
      pending_.wait(left, std::memory_order_acquire);
    }
  }
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen;
    for (int spins = 0;; ++spins) {
      gen = generation_.load(std::memory_order_acquire);
      if (gen != seen) break;
      if (spins < kSpinIterations) {
        TC_CPU_RELAX();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    (*job_)(index, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  const int nth = static_cast<int>(std::min<int64_t>(n_threads_, chunks));
  if (nth <= 1) {
    fn(0, n);
    return;
  }
  Run([&](int tid, int) {
    if (tid >= nth) return;
    const int64_t per = chunks / nth, extra = chunks % nth;
    const int64_t c0 = tid * per + std::min<int64_t>(tid, extra);
    const int64_t c1 = c0 + per + (tid < extra ? 1 : 0);
    const int64_t begin = c0 * grain, end = std::min(n, c1 * grain);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace thermocline
