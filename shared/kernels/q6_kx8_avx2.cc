// AVX2 dot product of Q6_K weights in the 8-row interleaved layout (shared/gguf/q6_kx8.h)
// against plain Q8_K activations.
//
// Why. The row kernel (KQuantKernel<Q6KInt> in matmul_avx2.cc) spends, per row and super-block
// (210 bytes), ~80 vector operations: the scale widening and permutes, 6 loads, the nibble and
// high-bit assembly of the 6-bit quants (~4 operations per 32 quant bytes), 8 maddubs, 8 scale
// shuffles and 8 madd, the offset madd, a conversion, a multiply, an FMA, and a horizontal sum
// per row at the end. Here a group of 8 rows shares what is not per-row bit assembly: per
// super-block (1680 bytes) the 64 maddubs against 4-byte activation broadcasts (loads, not
// shuffles) go in pairs into int16 (at most 2 x 2 x 63 x 127 = 32004, exact) before 32 madd
// apply the scales (widened once per sub-block pair, two byte shuffles, shared by the tile's
// tokens), 8 madd meet the scale pairs with the activation's bsums to take the +32 offset out,
// and one conversion, one multiply and one FMA finish 8 rows at once; no horizontal sum. About
// 60 operations per row-super-block instead of 80: Q6_K gains less than Q4_K from interleaving.
//
// Arithmetic. Per row the super-block's I is an exact int32 (|I| <= 16 x 128 x 16 x 32 x 127 <
// 2^31) added as DotQ6_Kx8Portable adds it: bit-identical to it. The row kernel keeps 8 partial
// lanes per row and sums them at the end, so the two differ by rounding only (the bound is
// derived in tests/unit/kquant_x8_test.cc).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "shared/gguf/q6_kx8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"
#include "shared/kernels/simd_avx2.h"

namespace thermocline::matmul_internal {
namespace {

using simd::Broadcast4;
using simd::Load32;

// As for Q4_K (q4_kx8_avx2.cc): a group is one sequential stream, prefetched two super-blocks
// ahead.
constexpr int64_t kPrefetchAhead = 2 * kQ6_Kx8BlockBytes;

// block_q8_K offsets: f32 d, int8 qs[256], int16 bsums[16].
constexpr int64_t kXq = 4, kXBsums = 4 + kQK_K;

// Bits 4-5 of every byte: the quant's top 2 bits for element range j (0..3) of a qh chunk, whose
// bytes hold them in bits 2j, 2j + 1. A 16-bit shift keeps each byte's own bits for these
// distances.
inline __m256i HighBits(__m256i qh, int j) {
  const __m256i mask = _mm256_set1_epi8(0x30);
  switch (j) {
    case 0:
      return _mm256_and_si256(_mm256_slli_epi16(qh, 4), mask);
    case 1:
      return _mm256_and_si256(_mm256_slli_epi16(qh, 2), mask);
    case 2:
      return _mm256_and_si256(qh, mask);
    default:
      return _mm256_and_si256(_mm256_srli_epi16(qh, 2), mask);
  }
}

// y[t * y_stride + i] for the group's 8 rows i and T tokens.
template <int T>
void GroupTile(const uint8_t* group, int64_t n_blocks, const uint8_t* x, int64_t x_stride,
               float* y, int64_t y_stride) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  // From a widened scale pair (lane r: int16 s0, s1), the int16 pairs (s0, s0) and (s1, s1).
  const __m256i first = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1,
                                         0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  const __m256i second = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                                          2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* wb = group + b * kQ6_Kx8BlockBytes;
    for (int64_t at = 0; at < kQ6_Kx8BlockBytes; at += 64) {
      PrefetchWeights(wb + kPrefetchAhead + at);
    }
    const uint8_t* xb[T];
    __m256i isum[T], offset[T];
    for (int t = 0; t < T; ++t) {
      xb[t] = x + t * x_stride + b * kQ8KBlockBytes;
      isum[t] = offset[t] = _mm256_setzero_si256();
    }
    // Unrolled, so that the element range j picks its shifts at compile time (GCC otherwise keeps
    // these loops and branches on j inside them).
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        // Elements 128h + 32j .. + 31: sub-blocks 8h + 2j (chunk lanes c < 4) and 8h + 2j + 1.
        const int p = 4 * h + j;
        const __m256i sc = _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kQ6_Kx8ScalesAt + 16 * p)));
        for (int t = 0; t < T; ++t) {
          offset[t] = _mm256_add_epi32(
              offset[t], _mm256_madd_epi16(sc, Broadcast4(xb[t] + kXBsums + 4 * p)));
        }
        const __m256i sc_pairs[2] = {_mm256_shuffle_epi8(sc, first),
                                     _mm256_shuffle_epi8(sc, second)};
        const uint8_t* ql = wb + kQ6_Kx8QlAt + 32 * (16 * h + 8 * (j % 2));
        const uint8_t* qh = wb + kQ6_Kx8QhAt + 32 * (8 * h);
#pragma GCC unroll 4
        for (int m = 0; m < 4; ++m) {
          __m256i s16[T];
          for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
          for (int c = 2 * m; c < 2 * m + 2; ++c) {
            const __m256i v = Load32(ql + 32 * c);
            const __m256i nib =
                j < 2 ? _mm256_and_si256(v, low) : _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            const __m256i q = _mm256_or_si256(nib, HighBits(Load32(qh + 32 * c), j));
            for (int t = 0; t < T; ++t) {
              const uint8_t* xq = xb[t] + kXq + 128 * h + 32 * j + 4 * c;
              s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(q, Broadcast4(xq)));
            }
          }
          for (int t = 0; t < T; ++t) {
            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], sc_pairs[m / 2]));
          }
        }
      }
    }
    for (int t = 0; t < T; ++t)
      isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(offset[t], 5));
    simd::AddSuperBlock(acc, wb + kQ6_Kx8DAt, xb, isum);
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

constexpr GroupTileFn kGroupTiles[] = {&GroupTile<1>, &GroupTile<2>, &GroupTile<3>, &GroupTile<4>};

}  // namespace

void PrepareQ6_Kx8Avx2(const float* x, int64_t cols, uint8_t* out) {
  // The row kernels' vectorized Q8_K rounding (bit-identical to QuantizeRowQ8_K), as is.
  Avx2Kernels(false).by_type[static_cast<size_t>(GgmlType::kQ6_K)].prepare_input(x, cols, out);
}

void DotQ6_Kx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  RunGroupTiles(kGroupTiles, groups, n_groups, cols / kQK_K, x, x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
