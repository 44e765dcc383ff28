#include "shared/util/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>

#include "shared/util/load_average.h"

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

// A worker spins at most this long for the next region before it sleeps: longer than the gap
// between two kernels of one step, much shorter than the gap between two steps of an idle
// server. Each region a worker woke for but found fully taken halves its own budget (down to
// kMinSpinNs), each one it helped with doubles it back.
constexpr int64_t kMaxSpinNs = 50'000;
constexpr int64_t kMinSpinNs = 1'000;
// While the machine is oversubscribed a worker barely spins (its spinning would take a core
// from a thread with work), nor does the caller wait long for pieces running elsewhere.
constexpr int64_t kBusySpinNs = 0;
constexpr int64_t kCallerSpinNs = 50'000;
constexpr int64_t kCallerBusySpinNs = 2'000;
// /proc/loadavg is read at most this often, by a caller starting a region.
constexpr int64_t kLoadCheckNs = 50'000'000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins until pred() or `budget_ns` has passed; the clock is read every 64 spins.
template <typename Pred>
bool SpinUntil(Pred pred, int64_t budget_ns) {
  if (budget_ns <= 0) return pred();
  const int64_t start = NowNs();
  for (int i = 1;; ++i) {
    if (pred()) return true;
    TC_CPU_RELAX();
    if ((i & 63) == 0 && NowNs() - start > budget_ns) return pred();
  }
}

// The pool whose region this thread is running a piece of: a region started from inside one
// runs on this thread alone (the other threads are busy with the outer region, and waiting
// for them from inside it would deadlock).
thread_local const ThreadPool* tls_inside = nullptr;

struct Inside {
  explicit Inside(const ThreadPool* p) : saved(tls_inside) { tls_inside = p; }
  ~Inside() { tls_inside = saved; }
  const ThreadPool* saved;
};

constexpr uint64_t kLow32 = 0xffffffffu;

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)), cpus_(UsableCpus()) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(2, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RefreshLoad() {
  const int64_t now = NowNs();
  if (now < next_load_check_ns_) return;
  next_load_check_ns_ = now + kLoadCheckNs;
  absl::StatusOr<LoadAverage> load = ReadLoadAverage();
  // Without /proc the pool behaves as on a quiet machine.
  oversubscribed_.store(load.ok() && Oversubscribed(*load, cpus_), std::memory_order_relaxed);
}

void ThreadPool::Run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1 || tls_inside == this) {
    for (int t = 0; t < n_threads_; ++t) fn(t, n_threads_);
    return;
  }
  RefreshLoad();
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  // Even: a barrier region.
  const uint32_t gen = (generation_.load(std::memory_order_relaxed) | 1) + 1;
  generation_.store(gen, std::memory_order_release);
  generation_.notify_all();
  {
    Inside in(this);
    fn(0, n_threads_);
  }
  const int64_t spin =
      oversubscribed_.load(std::memory_order_relaxed) ? kCallerBusySpinNs : kCallerSpinNs;
  SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; }, spin);
  for (int left; (left = pending_.load(std::memory_order_acquire)) != 0;) {
    pending_.wait(left, std::memory_order_acquire);
  }
  job_ = nullptr;
}

void ThreadPool::ForEachPiece(int64_t n_pieces, const std::function<void(int, int64_t)>& fn) {
  if (n_pieces <= 0) return;
  // The claim word holds a piece index in 32 bits.
  if (n_threads_ == 1 || n_pieces == 1 || tls_inside == this ||
      n_pieces > static_cast<int64_t>(kLow32 >> 1)) {
    Inside in(this);
    for (int64_t p = 0; p < n_pieces; ++p) fn(0, p);
    return;
  }
  RefreshLoad();
  piece_job_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  // Odd: a claimed region.
  const uint32_t gen = (generation_.load(std::memory_order_relaxed) | 1) + 2;
  const uint64_t tag = uint64_t{gen} << 32;
  claim_.store(tag, std::memory_order_relaxed);
  region_.store(tag | static_cast<uint64_t>(n_pieces), std::memory_order_relaxed);
  generation_.store(gen, std::memory_order_release);
  generation_.notify_all();  // a system call only when some worker sleeps
  const int64_t mine = RunPieces(gen, 0);
  const uint32_t total = static_cast<uint32_t>(n_pieces);
  const uint32_t before = done_.fetch_add(static_cast<uint32_t>(mine), std::memory_order_acq_rel);
  if (before + mine != total) {
    // Pieces a worker took are still running: spin briefly, then sleep so that, on a busy
    // machine, the worker can have this core.
    const int64_t spin =
        oversubscribed_.load(std::memory_order_relaxed) ? kCallerBusySpinNs : kCallerSpinNs;
    SpinUntil([&] { return done_.load(std::memory_order_acquire) == total; }, spin);
    for (uint32_t d; (d = done_.load(std::memory_order_acquire)) != total;) {
      done_.wait(d, std::memory_order_acquire);
    }
  }
  piece_job_ = nullptr;
}

void ThreadPool::ForEachPieceBytes(int64_t n_pieces, int64_t total_bytes,
                                   const std::function<void(int, int64_t)>& fn) {
  if (total_bytes < kMinParallelBytes) {
    Inside in(this);
    for (int64_t p = 0; p < n_pieces; ++p) fn(0, p);
    return;
  }
  ForEachPiece(n_pieces, fn);
}

int64_t ThreadPool::RunPieces(uint32_t gen, int index) {
  const uint64_t region = region_.load(std::memory_order_acquire);
  if ((region >> 32) != gen) return 0;  // that region is over and another has begun
  const uint64_t pieces = region & kLow32;
  const uint64_t tag = uint64_t{gen} << 32;
  const std::function<void(int, int64_t)>* job = nullptr;
  int64_t ran = 0;
  Inside in(this);
  uint64_t w = claim_.load(std::memory_order_acquire);
  for (;;) {
    if ((w & ~kLow32) != tag || (w & kLow32) >= pieces) break;
    if (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;
    }
    // The region cannot end before this piece is counted done, so its job is alive.
    if (job == nullptr) job = piece_job_;
    (*job)(index, static_cast<int64_t>(w & kLow32));
    ++ran;
    w = claim_.load(std::memory_order_acquire);
  }
  return ran;
}

uint32_t ThreadPool::WaitForRegion(uint32_t seen, int64_t spin_ns) const {
  uint32_t gen = seen;
  SpinUntil([&] { return (gen = generation_.load(std::memory_order_acquire)) != seen; },
            spin_ns);
  while (gen == seen) {
    generation_.wait(seen, std::memory_order_acquire);
    gen = generation_.load(std::memory_order_acquire);
  }
  return gen;
}

void ThreadPool::WorkerLoop(int index) {
  // Named so that top -H, a debugger or a test can tell the pool's threads apart.
  pthread_setname_np(pthread_self(), "tc-pool");
  uint32_t seen = 0;
  int64_t spin_ns = kMaxSpinNs;
  for (;;) {
    const int64_t budget =
        oversubscribed_.load(std::memory_order_relaxed) ? kBusySpinNs : spin_ns;
    const uint32_t gen = WaitForRegion(seen, budget);
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    if ((gen & 1) == 0) {
      {
        Inside in(this);
        (*job_)(index, n_threads_);
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
      continue;
    }
    const int64_t ran = RunPieces(gen, index);
    if (ran == 0) {
      spin_ns = std::max(kMinSpinNs, spin_ns / 2);
      continue;
    }
    spin_ns = std::min(kMaxSpinNs, spin_ns * 2);
    worker_pieces_.fetch_add(ran, std::memory_order_relaxed);
    const uint32_t total = static_cast<uint32_t>(region_.load(std::memory_order_relaxed));
    const uint32_t before = done_.fetch_add(static_cast<uint32_t>(ran), std::memory_order_acq_rel);
    if (before + static_cast<uint32_t>(ran) == total) done_.notify_one();
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
  // Claimed pieces of shrinking size (GuidedCut). Equal pieces (four per thread) left the
  // caller or the worker idle for half a piece, on average, at the end of every region: about
  // 3% of each thread's decode time at two threads, 170 regions per token.
  Cut starts;
  GuidedCut(chunks, nth, starts);
  ForEachPiece(static_cast<int64_t>(starts.size()) - 1, [&](int, int64_t p) {
    const int64_t begin = starts[p] * grain, end = std::min(n, starts[p + 1] * grain);
    if (begin < end) fn(begin, end);
  });
}

void ThreadPool::GuidedCut(int64_t chunks, int threads, Cut& starts) {
  starts.clear();
  const int64_t split = 2 * std::max(1, threads);
  const int64_t least = std::max<int64_t>(1, chunks / (32 * split));
  for (int64_t c = 0; c < chunks;) {
    starts.push_back(c);
    const int64_t left = chunks - c;
    c += std::min(left, std::max(least, left / split));
  }
  starts.push_back(chunks);
}

int64_t ThreadPool::GrainForBytes(int64_t item_bytes, int64_t align) {
  align = std::max<int64_t>(1, align);
  const int64_t per_item = std::max<int64_t>(1, item_bytes);
  const int64_t items = (kMinPieceBytes + per_item - 1) / per_item;
  return (std::max(items, align) + align - 1) / align * align;
}

void ThreadPool::ParallelForBytes(int64_t n, int64_t item_bytes,
                                  const std::function<void(int64_t, int64_t)>& fn,
                                  int64_t align) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n * std::max<int64_t>(1, item_bytes) < kMinParallelBytes) {
    fn(0, n);
    return;
  }
  ParallelFor(n, fn, GrainForBytes(item_bytes, align));
}

}  // namespace thermocline
