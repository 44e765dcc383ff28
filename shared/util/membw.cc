#include "shared/util/membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>

#include "shared/util/cpu_features.h"

namespace thermocline {
namespace {

constexpr size_t kPage = 4096;
constexpr int kReps = 5;

uint64_t SumWordsPortable(const uint64_t* p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

}  // namespace

double MeasureReadBandwidthGBs(ThreadPool& pool, size_t bytes) {
  const int nth = pool.size();
  const size_t share = std::max(kPage, bytes / nth / kPage * kPage);
  const size_t total = share * nth;
  uint64_t* buf = static_cast<uint64_t*>(std::aligned_alloc(kPage, total));
  if (buf == nullptr) return 0.0;
  const size_t words = share / sizeof(uint64_t);
  const bool avx2 = DetectSimdLevel() == SimdLevel::kAvx2;
  // Each thread first-touches its own share, so on NUMA machines the pages sit where they are
  // read (as the workers' weights do).
  pool.Run([&](int tid, int) {
    uint64_t* p = buf + tid * words;
    for (size_t i = 0; i < words; ++i) p[i] = i * 0x9E3779B97F4A7C15ull + tid;
  });
  // Publishing every thread's sum keeps the reads from being optimized away.
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int rep = 0; rep < kReps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pool.Run([&](int tid, int) {
      const uint64_t* p = buf + tid * words;
      const uint64_t s =
          avx2 ? membw_internal::SumWordsAvx2(p, words) : SumWordsPortable(p, words);
      sink.fetch_add(s, std::memory_order_relaxed);
    });
    const double sec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(total) / sec / 1e9);
  }
  std::free(buf);
  return best;
}

}  // namespace thermocline
