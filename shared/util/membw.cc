#include "shared/util/membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "shared/util/cpu_features.h"
#include "shared/util/page_arena.h"

namespace thermocline {
namespace {

constexpr size_t kPage = 4096;
constexpr int kReps = 5;

// Eight streams in lockstep, as in SumWordsAvx2.
uint64_t SumWordsPortable(const uint64_t* p, size_t n) {
  constexpr size_t kStreams = 8;
  const size_t per = n / kStreams;
  uint64_t acc[kStreams] = {};
  for (size_t i = 0; i < per; ++i) {
    for (size_t s = 0; s < kStreams; ++s) acc[s] += p[s * per + i];
  }
  uint64_t sum = 0;
  for (size_t s = 0; s < kStreams; ++s) sum += acc[s];
  for (size_t i = kStreams * per; i < n; ++i) sum += p[i];
  return sum;
}

// SumRowsAvx2's sum without AVX2.
uint64_t SumRowsPortable(const uint8_t* const* rows, const uint8_t* const* next, int n_rows,
                         size_t bytes) {
  uint64_t acc[membw_internal::kMaxLockstepRows] = {};
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    if (next != nullptr && i % 64 == 0) {
      for (int r = 0; r < n_rows; ++r) __builtin_prefetch(next[r] + i, 0, 3);
    }
    for (int r = 0; r < n_rows; ++r) {
      uint64_t v;
      std::memcpy(&v, rows[r] + i, sizeof v);
      acc[r] += v;
    }
  }
  uint64_t sum = 0;
  for (int r = 0; r < n_rows; ++r) sum += acc[r];
  for (; i < bytes; ++i) {
    for (int r = 0; r < n_rows; ++r) sum += rows[r][i];
  }
  return sum;
}

}  // namespace

double TimeParallelRead(ThreadPool& pool, const void* data, size_t bytes) {
  const uint64_t* words = static_cast<const uint64_t*>(data);
  const size_t n_words = bytes / sizeof(uint64_t);
  const bool avx2 = DetectSimdLevel() >= SimdLevel::kAvx2;
  // Publishing every thread's sum keeps the reads from being optimized away.
  std::atomic<uint64_t> sink{0};
  const auto start = std::chrono::steady_clock::now();
  // A barrier on purpose: the figure is the bandwidth of all threads reading at once, so every
  // thread must stream its share at the same time (claimed pieces would let one thread read
  // everything and measure one thread's bandwidth).
  pool.Run([&](int tid, int nth) {
    // Shares start on 32-byte boundaries (4 words) for the aligned vector loads.
    const size_t w0 = n_words * tid / nth / 4 * 4;
    const size_t w1 = tid + 1 == nth ? n_words : n_words * (tid + 1) / nth / 4 * 4;
    const uint64_t* p = words + w0;
    const uint64_t s =
        avx2 ? membw_internal::SumWordsAvx2(p, w1 - w0) : SumWordsPortable(p, w1 - w0);
    sink.fetch_add(s, std::memory_order_relaxed);
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double TimeScatteredRead(ThreadPool& pool, const uint8_t* base, int64_t row_bytes,
                         const int32_t* ids, int64_t n_ids, int64_t ahead_bytes,
                         uint64_t* checksum) {
  const bool avx2 = DetectSimdLevel() >= SimdLevel::kAvx2;
  // As PrefetchAheadRows: the first whole group of rows at least ahead_bytes on.
  constexpr int kLockstep = membw_internal::kMaxLockstepRows;
  const int64_t group = kLockstep * std::max<int64_t>(1, row_bytes);
  const int64_t ahead = ahead_bytes > 0 ? kLockstep * ((ahead_bytes + group - 1) / group) : 0;
  std::atomic<uint64_t> sink{0};
  const auto start = std::chrono::steady_clock::now();
  // A barrier, as in TimeParallelRead: all threads read at once.
  pool.Run([&](int tid, int nth) {
    const int64_t i0 = n_ids * tid / nth, i1 = n_ids * (tid + 1) / nth;
    uint64_t s = 0;
    for (int64_t i = i0; i < i1; i += kLockstep) {
      const int n = static_cast<int>(std::min<int64_t>(kLockstep, i1 - i));
      const uint8_t* rows[kLockstep];
      const uint8_t* next[kLockstep];
      for (int r = 0; r < n; ++r) {
        rows[r] = base + ids[i + r] * row_bytes;
        next[r] = base + ids[std::min(i + ahead + r, i1 - 1)] * row_bytes;
      }
      const uint8_t* const* pf = ahead > 0 && i + ahead < i1 ? next : nullptr;
      s += avx2 ? membw_internal::SumRowsAvx2(rows, pf, n, static_cast<size_t>(row_bytes))
                : SumRowsPortable(rows, pf, n, static_cast<size_t>(row_bytes));
    }
    sink.fetch_add(s, std::memory_order_relaxed);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (checksum != nullptr) *checksum = sink.load(std::memory_order_relaxed);
  return seconds;
}

double MeasureReadBandwidthGBs(ThreadPool& pool, size_t bytes) {
  const size_t total = std::max(kPage, bytes / kPage * kPage);
  // Huge pages, as the memory the decode streams is (page_arena.h).
  const PageBuffer pages(total);
  uint64_t* buf = reinterpret_cast<uint64_t*>(pages.data());
  if (buf == nullptr) return 0.0;
  const size_t words = total / sizeof(uint64_t);
  // Each thread first-touches the share it will read, so on NUMA machines the pages sit where
  // they are read (as the workers' weights do).
  pool.Run([&](int tid, int nth) {
    const size_t w0 = words * tid / nth / 4 * 4;
    const size_t w1 = tid + 1 == nth ? words : words * (tid + 1) / nth / 4 * 4;
    for (size_t i = w0; i < w1; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  });
  double best = 0.0;
  for (int rep = 0; rep < kReps; ++rep) {
    best = std::max(best, static_cast<double>(total) / TimeParallelRead(pool, buf, total) / 1e9);
  }
  return best;
}

}  // namespace thermocline
