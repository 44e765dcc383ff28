// AVX-512 attention products with the avx2 file's bits (attention.h): a zmm holds the 8-lane
// accumulators of two positions side by side, each half reduced as avx2 reduces its ymm; the
// mix adds each element's rows in the same order at 16 columns per register.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "shared/kernels/attention_kernels.h"
#include "shared/kernels/attention_rows.h"
#include "shared/kernels/simd_avx512.h"

namespace thermocline::attention_internal {
namespace {

// The avx2 loads plus pairs of rows and 16 columns.
struct F32Row512 : F32Row {
  // Eight elements of row a in lanes 0-7, eight of row b in 8-15.
  static __m512 LoadPair(const uint8_t* a, const uint8_t* b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(Load8(a)), Load8(b), 1);
  }
  static __m512 Load16(const uint8_t* p) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  }
};
struct F16Row512 : F16Row {
  static __m512 LoadPair(const uint8_t* a, const uint8_t* b) {
    const __m256i h = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
    return _mm512_cvtph_ps(h);
  }
  static __m512 Load16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};

// Four pairs (eight positions) at a time: four FMA chains, as avx2's four single positions.
template <class L>
void Scores(const float* q, const uint8_t* const* k_rows, int64_t n, int64_t head_dim, float scale,
            float* scores) {
  constexpr int kPairs = 4;
  const int64_t full = head_dim / 8 * 8, rest = head_dim - full;
  alignas(32) float q_tail[8] = {};
  std::memcpy(q_tail, q + full, rest * sizeof(float));
  alignas(32) uint8_t zeros[8 * L::kBytes] = {};
  for (int64_t j0 = 0; j0 < n; j0 += 2 * kPairs) {
    const int np = static_cast<int>(n - j0 < 2 * kPairs ? n - j0 : 2 * kPairs);
    PrefetchRowsAhead<L>(k_rows, j0, 2 * kPairs, n, 0, head_dim * L::kBytes);
    // A position past the end reads the zero row; its half is never stored.
    const uint8_t* rows[2 * kPairs];
    for (int p = 0; p < 2 * kPairs; ++p) rows[p] = p < np ? k_rows[j0 + p] : nullptr;
    const int pairs = (np + 1) / 2;
    __m512 acc[kPairs];
    for (int p = 0; p < kPairs; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 8) {
      const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + c));
      for (int p = 0; p < pairs; ++p) {
        const uint8_t* a = rows[2 * p] + c * L::kBytes;
        const uint8_t* b = rows[2 * p + 1] != nullptr ? rows[2 * p + 1] + c * L::kBytes : zeros;
        acc[p] = _mm512_fmadd_ps(L::LoadPair(a, b), qv, acc[p]);
      }
    }
    if (rest > 0) {
      const __m512 qv = _mm512_broadcast_f32x8(_mm256_load_ps(q_tail));
      for (int p = 0; p < pairs; ++p) {
        alignas(32) uint8_t ta[8 * L::kBytes] = {}, tb[8 * L::kBytes] = {};
        std::memcpy(ta, rows[2 * p] + full * L::kBytes, rest * L::kBytes);
        if (rows[2 * p + 1] != nullptr) {
          std::memcpy(tb, rows[2 * p + 1] + full * L::kBytes, rest * L::kBytes);
        }
        acc[p] = _mm512_fmadd_ps(L::LoadPair(ta, tb), qv, acc[p]);
      }
    }
    for (int p = 0; p < pairs; ++p) {
      float lo, hi;
      simd::HalfSums(acc[p], &lo, &hi);
      scores[j0 + 2 * p] = lo * scale;
      if (2 * p + 1 < np) scores[j0 + 2 * p + 1] = hi * scale;
    }
  }
}

// Columns in chunks of 8 zmm held across all rows; 8 and then single columns at the end.
template <class L>
void Mix(const float* weights, const uint8_t* const* v_rows, int64_t n, int64_t head_dim,
         float* out) {
  constexpr int kRegs = 8;
  int64_t c0 = 0;
  while (c0 + 16 <= head_dim) {
    const int64_t left = (head_dim - c0) / 16;
    const int nr = static_cast<int>(left < kRegs ? left : kRegs);
    __m512 acc[kRegs];
    for (int k = 0; k < kRegs; ++k) acc[k] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      PrefetchRowsAhead<L>(v_rows, j, 1, n, c0 * L::kBytes, 16 * nr * L::kBytes);
      const __m512 a = _mm512_set1_ps(weights[j]);
      const uint8_t* v = v_rows[j] + c0 * L::kBytes;
      for (int k = 0; k < nr; ++k) {
        acc[k] = _mm512_fmadd_ps(a, L::Load16(v + 16 * k * L::kBytes), acc[k]);
      }
    }
    for (int k = 0; k < nr; ++k) _mm512_storeu_ps(out + c0 + 16 * k, acc[k]);
    c0 += 16 * nr;
  }
  if (c0 + 8 <= head_dim) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(weights[j]), L::Load8(v_rows[j] + c0 * L::kBytes), acc);
    }
    _mm256_storeu_ps(out + c0, acc);
    c0 += 8;
  }
  MixTail<L>(weights, v_rows, n, c0, head_dim, out);
}

constexpr AttentionKernels kAvx512[2] = {{&Scores<F32Row512>, &Mix<F32Row512>},
                                         {&Scores<F16Row512>, &Mix<F16Row512>}};

}  // namespace

const AttentionKernels* Avx512AttentionKernels() { return kAvx512; }

}  // namespace thermocline::attention_internal
