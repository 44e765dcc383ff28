// The machine's memory read bandwidth, measured in the same process as a benchmark so that
// results can be reported as a fraction of the hardware floor (see docs/performance.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "shared/util/thread_pool.h"

namespace thermocline {

// Streams `bytes` (rounded down to whole pages) with every thread of the pool reading its own
// contiguous share, a few times, and returns the best rate in GB/s (1e9 bytes per second). Each
// thread reads its share as eight streams in lockstep: one sequential stream leaves bandwidth
// unused on cores whose rate is limited by outstanding misses (a GEMV reads several rows at
// once, so a single-stream floor would understate what a kernel can reach). Use a buffer well
// above the last-level cache, or this measures the cache.
double MeasureReadBandwidthGBs(ThreadPool& pool, size_t bytes = size_t{512} << 20);

// Seconds the pool takes to read [data, data + bytes) once, each thread summing its own
// contiguous share (the way MatMul splits rows), so a benchmark can time the plain read of the
// very bytes a kernel streams, interleaved with the kernel. `data` must be 32-byte aligned.
double TimeParallelRead(ThreadPool& pool, const void* data, size_t bytes);

// Seconds the pool takes to read rows ids[0..n_ids) of the rows at `base` (row_bytes each)
// once: the plain read a sparse kernel's gathered rows cost, for reporting the kernel against the
// floor of its own access pattern. Each thread reads its contiguous share of the ids (the way
// GatherMatMul and AxpyRows split them) kMaxLockstepRows rows at a time in lockstep, as the
// kernels' tiles do, and when ahead_bytes > 0 prefetches (T0) every line of the rows at least
// ahead_bytes of rows on, as the kernels' tile drivers do (matmul_kernels.h,
// kPrefetchAheadBytes).
// `checksum`, when given, receives the sum of every row's 64-bit words (native byte order) and
// trailing bytes, mod 2^64: what a test checks to see that exactly those bytes were read.
double TimeScatteredRead(ThreadPool& pool, const uint8_t* base, int64_t row_bytes,
                         const int32_t* ids, int64_t n_ids, int64_t ahead_bytes,
                         uint64_t* checksum = nullptr);

namespace membw_internal {
// Sum of n 64-bit words; the AVX2 translation unit's entry point (call only on AVX2 CPUs).
uint64_t SumWordsAvx2(const uint64_t* p, size_t n);
// Rows one gathered read takes in lockstep, as the kernels' tiles read 4 or 8 rows at once.
inline constexpr int kMaxLockstepRows = 8;
// Sum of the 64-bit words and trailing bytes of rows[0..n_rows) (n_rows <= kMaxLockstepRows),
// `bytes` each, read in lockstep in 32-byte steps, any alignment (AVX2 only). With `next`, each
// step at a line start also prefetches that line of next[0..n_rows), spread over the pass as the
// kernels spread them.
uint64_t SumRowsAvx2(const uint8_t* const* rows, const uint8_t* const* next, int n_rows,
                     size_t bytes);
}  // namespace membw_internal

}  // namespace thermocline
