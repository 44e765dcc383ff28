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

namespace membw_internal {
// Sum of n 64-bit words; the AVX2 translation unit's entry point (call only on AVX2 CPUs).
uint64_t SumWordsAvx2(const uint64_t* p, size_t n);
}  // namespace membw_internal

}  // namespace thermocline
