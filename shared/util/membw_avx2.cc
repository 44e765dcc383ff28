#include <immintrin.h>

#include <cstring>

#include "shared/util/membw.h"

namespace thermocline::membw_internal {

uint64_t SumWordsAvx2(const uint64_t* p, size_t n) {
  // Eight streams in lockstep, each over its own eighth of the range, with one integer add
  // apiece (one cycle of latency), so the loop is limited by the memory system alone.
  constexpr size_t kStreams = 8;
  const size_t per = n / kStreams / 4 * 4;
  __m256i acc[kStreams];
  for (size_t s = 0; s < kStreams; ++s) acc[s] = _mm256_setzero_si256();
  for (size_t i = 0; i < per; i += 4) {
    for (size_t s = 0; s < kStreams; ++s) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + s * per + i));
      acc[s] = _mm256_add_epi64(acc[s], v);
    }
  }
  __m256i total = acc[0];
  for (size_t s = 1; s < kStreams; ++s) total = _mm256_add_epi64(total, acc[s]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (size_t i = kStreams * per; i < n; ++i) sum += p[i];
  return sum;
}

uint64_t SumRowsAvx2(const uint8_t* const* rows, const uint8_t* const* next, int n_rows,
                     size_t bytes) {
  // The rows in lockstep, one unaligned 32-byte load of each in turn (a gathered row starts
  // anywhere), each into its own sum.
  __m256i acc[kMaxLockstepRows];
  for (int r = 0; r < n_rows; ++r) acc[r] = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    if (next != nullptr && i % 64 == 0) {
      for (int r = 0; r < n_rows; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(next[r] + i), _MM_HINT_T0);
    }
    for (int r = 0; r < n_rows; ++r) {
      acc[r] = _mm256_add_epi64(acc[r],
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + i)));
    }
  }
  __m256i total = _mm256_setzero_si256();
  for (int r = 0; r < n_rows; ++r) total = _mm256_add_epi64(total, acc[r]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  // The tail as SumRowsPortable takes it: whole words, then bytes (the line it is on was
  // prefetched with the step before).
  for (; i + 8 <= bytes; i += 8) {
    for (int r = 0; r < n_rows; ++r) {
      uint64_t v;
      std::memcpy(&v, rows[r] + i, sizeof v);
      sum += v;
    }
  }
  for (; i < bytes; ++i) {
    for (int r = 0; r < n_rows; ++r) sum += rows[r][i];
  }
  return sum;
}

}  // namespace thermocline::membw_internal
