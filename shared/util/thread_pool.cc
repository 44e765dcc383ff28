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
constexpr int kPiecesPerThread = 4;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(2, std::memory_order_acq_rel);
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
  // Even: a barrier region.
  const uint64_t gen = generation_.load(std::memory_order_relaxed);
  generation_.store((gen | 1) + 1, std::memory_order_release);
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

void ThreadPool::RunShared(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  // Odd: a shared region.
  const uint64_t gen = (generation_.load(std::memory_order_relaxed) | 1) + 2;
  generation_.store(gen, std::memory_order_seq_cst);
  generation_.notify_all();
  fn(0, n_threads_);
  // Close the region, then wait for the workers inside it. A worker counts itself in before it
  // checks `closed_` (both seq_cst): either the wait below sees it, or it sees the region
  // closed and never touches job_.
  closed_.store(gen, std::memory_order_seq_cst);
  for (int spins = 0;; ++spins) {
    const int inside = active_.load(std::memory_order_seq_cst);
    if (inside == 0) break;
    if (spins < kSpinIterations) {
      TC_CPU_RELAX();
    } else {
      active_.wait(inside, std::memory_order_seq_cst);
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
    if ((gen & 1) != 0) {
      active_.fetch_add(1, std::memory_order_seq_cst);
      if (closed_.load(std::memory_order_seq_cst) < gen) (*job_)(index, n_threads_);
      if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1) active_.notify_one();
      continue;
    }
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
  // A few pieces per thread: enough that a thread scheduled late finds others have taken its
  // share, few enough that claiming them costs nothing next to the work.
  const int64_t pieces = std::min<int64_t>(chunks, int64_t{kPiecesPerThread} * nth);
  std::atomic<int64_t> next{0};
  RunShared([&](int, int) {
    for (;;) {
      const int64_t p = next.fetch_add(1, std::memory_order_relaxed);
      if (p >= pieces) return;
      const int64_t per = chunks / pieces, extra = chunks % pieces;
      const int64_t c0 = p * per + std::min<int64_t>(p, extra);
      const int64_t c1 = c0 + per + (p < extra ? 1 : 0);
      const int64_t begin = c0 * grain, end = std::min(n, c1 * grain);
      if (begin < end) fn(begin, end);
    }
  });
}

}  // namespace thermocline
