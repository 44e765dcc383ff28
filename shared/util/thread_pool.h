// A fixed pool of worker threads for fork-join kernels.
//
// A decode step runs hundreds of small parallel regions. Three rules keep it fast when the
// machine has more runnable threads than cores (docs/performance.md, "Threads on a busy
// machine"):
//  - Work is claimed, not assigned: a region is cut into pieces that whoever is running takes
//    from a shared counter, the caller included, and the caller waits only for pieces that a
//    worker has actually taken. A worker that is not scheduled holds up nothing; one that wakes
//    after the last piece is taken skips the region. ParallelFor's pieces shrink as the region
//    goes (GuidedCut), so both threads run out of work within one short piece of each other.
//  - Small work stays on the caller: ParallelForBytes runs a region below kMinParallelBytes of
//    memory traffic on the calling thread without waking anyone (the threshold is measured by
//    bench/thread_pool_bench).
//  - Spinning is bounded: a worker spins for a while before sleeping (std::atomic::wait, a
//    futex), because waking a sleeping thread costs tens of microseconds; the while shrinks
//    each time spinning proved useless (the worker found its region already taken) and drops to
//    almost nothing while /proc/loadavg shows more runnable threads than CPUs. The caller spins
//    as briefly before it sleeps on the pieces still running elsewhere.
// Run is the exception, a barrier (every thread runs fn once); it is kept for the one caller
// that needs all threads at the same time (the bandwidth measurement).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace thermocline {

class ThreadPool {
 public:
  // Below this much memory traffic a region runs on the caller. bench/thread_pool_bench on
  // this 2-core machine: a region costs the caller 0.2-0.5 us when the worker spins, 5-6 us
  // when it sleeps; a GEMV on weights in cache moves 65 GB/s (f32) or 12 GB/s (q4_0) per
  // thread; splitting it over 2 threads lost up to 128 KiB (ratio 0.88-0.93) and won from
  // 256 KiB (1.01-1.45), for both types (docs/performance.md has the tables).
  static constexpr int64_t kMinParallelBytes = 256 << 10;
  // Each claimed piece carries at least this much traffic, so claims stay cheap next to work.
  static constexpr int64_t kMinPieceBytes = 16 << 10;

  // `n_threads` counts the calling thread; 1 means everything runs on the caller. A pool takes
  // one caller at a time (regions from two threads at once are not supported); a region
  // started from inside one of its own regions runs on the thread that starts it.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index, n_threads) once on every thread (the caller is index 0) and returns
  // when all calls have returned: a barrier, so it waits for the slowest thread. Only for work
  // that needs every thread at once.
  void Run(const std::function<void(int, int)>& fn);

  // Calls fn(thread_index, piece) once for every piece in [0, n_pieces), on whichever threads
  // claim them (the caller is index 0; two calls running at the same time have different
  // indices, for per-thread scratch). Returns when every piece has returned. A result that
  // depends only on its piece does not depend on which thread ran it.
  void ForEachPiece(int64_t n_pieces, const std::function<void(int, int64_t)>& fn);

  // ForEachPiece for pieces that together move `total_bytes` of memory: on the caller alone,
  // without waking anyone, below kMinParallelBytes.
  void ForEachPieceBytes(int64_t n_pieces, int64_t total_bytes,
                         const std::function<void(int, int64_t)>& fn);

  // Cuts [0, n) into contiguous pieces, each a multiple of `grain` except the last, and calls
  // fn(begin, end) once per piece, on whichever threads claim them. The cut depends only on n,
  // grain and size(), never on timing (GuidedCut).
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  // ParallelFor's cut of `chunks` grains over `threads` threads: the start of every piece, then
  // `chunks`. Pieces shrink as the work left does (each about the rest over 2 x threads, never
  // under chunks / (64 x threads) nor 1), so the threads start on long runs and finish on
  // short ones: a region ends at most one short piece after its first thread runs out of work.
  using Cut = absl::InlinedVector<int64_t, 48>;
  static void GuidedCut(int64_t chunks, int threads, Cut& starts);

  // ParallelFor over n items that each move `item_bytes` of memory: on the caller alone when
  // all of them are below kMinParallelBytes, else in pieces of at least kMinPieceBytes (and a
  // multiple of `align` items), so that each thread's share is balanced by bytes.
  void ParallelForBytes(int64_t n, int64_t item_bytes,
                        const std::function<void(int64_t, int64_t)>& fn, int64_t align = 1);

  // The grain ParallelForBytes uses: items per piece for that many bytes per item.
  static int64_t GrainForBytes(int64_t item_bytes, int64_t align = 1);

  // For tests and benchmarks: pieces run by workers (not the caller) since construction.
  int64_t pieces_run_by_workers() const {
    return worker_pieces_.load(std::memory_order_relaxed);
  }

 private:
  void WorkerLoop(int index);
  // Waits (bounded spin, then futex) until generation_ differs from `seen`; returns it.
  uint32_t WaitForRegion(uint32_t seen, int64_t spin_ns) const;
  // Claims and runs pieces of region `gen` until none is left; returns how many it ran.
  int64_t RunPieces(uint32_t gen, int index);
  void RefreshLoad();

  const int n_threads_;
  std::vector<std::thread> workers_;
  // The region in progress. job_/piece_job_ are written by the caller before it publishes
  // generation_ and read by a worker only while the region cannot finish without it.
  const std::function<void(int, int)>* job_ = nullptr;
  const std::function<void(int, int64_t)>* piece_job_ = nullptr;
  // Bumped by 2 per region (the futex word workers sleep on); the low bit says a claimed region.
  std::atomic<uint32_t> generation_{0};
  // Claimed regions: (generation << 32) | pieces, and (generation << 32) | next piece to take;
  // the generation tag lets a late worker see that the region it woke for is over without
  // touching anything of it.
  std::atomic<uint64_t> region_{0};
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint32_t> done_{0};     // pieces of the current claimed region that returned
  std::atomic<int> pending_{0};       // Run: workers that have not finished
  std::atomic<bool> oversubscribed_{false};
  std::atomic<int64_t> worker_pieces_{0};
  std::atomic<bool> stop_{false};
  int64_t next_load_check_ns_ = 0;  // caller only
  const int cpus_;
};

}  // namespace thermocline
