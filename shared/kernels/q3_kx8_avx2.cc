// AVX2 dot product of Q3_K weights in the 8-row interleaved layout (shared/gguf/q3_kx8.h)
// against plain Q8_K activations: a group's 8 rows in the 8 lanes of a ymm.
//
// Each chunk's 3-bit quants are assembled per lane (two low bits shifted down and masked, the
// third bit shifted to bit 2 and masked, one OR) as unsigned bytes 0..7, which meet 4-byte
// activation broadcasts: maddubs, four chunks summed in int16 (at most 4 x 2 x 7 x 127 = 7112,
// exact) and widened by madd with ones, or with AVX-VNNI (kVnni) vpdpbusd straight into the
// lanes. The quants' -4 comes out once per sub-block as 4 x its bsum, and one 32-bit multiply
// applies the sub-block's scale, decoded per lane from the row's three packed scale words.
//
// Arithmetic. Per row the super-block's I is DotQ3_Kx8Portable's exact int32, added as it adds
// it: bit-identical to it.
#include <immintrin.h>

#include <cstdint>

#include "shared/gguf/q3_kx8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"
#include "shared/kernels/simd_avx2.h"

namespace thermocline::matmul_internal {
namespace {

using simd::Broadcast4;
using simd::Load32;

// A group is one sequential stream, prefetched two super-blocks ahead (as Q4_K's).
constexpr int64_t kPrefetchAhead = 2 * kQ3_Kx8BlockBytes;

constexpr int64_t kXq = 4, kXBsums = 4 + kQK_K;  // block_q8_K: f32 d, int8 qs[256], bsums[16]

// Sub-block kS's scale per lane from the row's packed words w[0..2] (bytes 0-3, 4-7, 8-11): the
// low nibble of byte kS (kS < 8) or the high nibble of byte kS - 8, the two high bits at bit
// 2 (kS / 4) of byte 8 + kS % 4, minus 32.
template <int kS>
inline __m256i SubBlockScale(const __m256i (&w)[3]) {
  constexpr int kLowShift = 8 * (kS % 4) + (kS >= 8 ? 4 : 0);
  constexpr int kHighShift = 8 * (kS % 4) + 2 * (kS / 4);
  const __m256i low =
      _mm256_and_si256(_mm256_srli_epi32(w[(kS % 8) / 4], kLowShift), _mm256_set1_epi32(0x0F));
  const __m256i high = _mm256_and_si256(_mm256_srli_epi32(w[2], kHighShift), _mm256_set1_epi32(3));
  return _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
}

// The third quant bit of element range kJ of half kH (bit 4 kH + kJ of each hmask byte) at bit 2.
template <int kH, int kJ>
inline __m256i ThirdBit(__m256i hm) {
  constexpr int kBit = 4 * kH + kJ;
  const __m256i mask = _mm256_set1_epi8(4);
  if constexpr (kBit < 2) return _mm256_and_si256(_mm256_slli_epi16(hm, 2 - kBit), mask);
  if constexpr (kBit == 2) return _mm256_and_si256(hm, mask);
  if constexpr (kBit > 2) return _mm256_and_si256(_mm256_srli_epi16(hm, kBit - 2), mask);
}

// y[t * y_stride + i] for the group's 8 rows i and T tokens.
template <bool kVnni, int T>
void GroupTile(const uint8_t* group, int64_t n_blocks, const uint8_t* x, int64_t x_stride, float* y,
               int64_t y_stride) {
  const __m256i three = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* wb = group + b * kQ3_Kx8BlockBytes;
    for (int64_t at = 0; at < kQ3_Kx8BlockBytes; at += 64) {
      PrefetchWeights(wb + kPrefetchAhead + at);
    }
    const uint8_t* xb[T];
    __m256i isum[T];
    alignas(32) int32_t offset[T][16];  // 4 x each sub-block's activation sum
    for (int t = 0; t < T; ++t) {
      xb[t] = x + t * x_stride + b * kQ8KBlockBytes;
      isum[t] = _mm256_setzero_si256();
      for (int k = 0; k < 2; ++k) {
        const __m256i sums = _mm256_cvtepi16_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb[t] + kXBsums + 16 * k)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(offset[t] + 8 * k),
                           _mm256_slli_epi32(sums, 2));
      }
    }
    const __m256i w[3] = {Load32(wb + kQ3_Kx8ScalesAt), Load32(wb + kQ3_Kx8ScalesAt + 32),
                          Load32(wb + kQ3_Kx8ScalesAt + 64)};
    __m256i hm[8];
    for (int c = 0; c < 8; ++c) hm[c] = Load32(wb + kQ3_Kx8HmaskAt + 32 * c);
    auto half = [&]<int kH>() {
      __m256i qs[8];
      for (int c = 0; c < 8; ++c) qs[c] = Load32(wb + kQ3_Kx8QsAt + 32 * (8 * kH + c));
      auto range = [&]<int kJ>() {
        auto sub_block = [&]<int kU>() {
          constexpr int kS = 8 * kH + 2 * kJ + kU;
          __m256i sum[T];
          for (int t = 0; t < T; ++t) sum[t] = _mm256_setzero_si256();
          __m256i s16[T];
          for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
          for (int c = 4 * kU; c < 4 * kU + 4; ++c) {
            const __m256i q = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(qs[c], 2 * kJ), three), ThirdBit<kH, kJ>(hm[c]));
            for (int t = 0; t < T; ++t) {
              const __m256i xv = Broadcast4(xb[t] + kXq + 128 * kH + 32 * kJ + 4 * c);
              if constexpr (kVnni) {
                sum[t] = simd::DpbusdVex(sum[t], q, xv);
              } else {
                s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(q, xv));
              }
            }
          }
          const __m256i sc = SubBlockScale<kS>(w);
          for (int t = 0; t < T; ++t) {
            if constexpr (!kVnni) sum[t] = _mm256_madd_epi16(s16[t], ones);
            const __m256i centred = _mm256_sub_epi32(sum[t], _mm256_set1_epi32(offset[t][kS]));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(centred, sc));
          }
        };
        sub_block.template operator()<0>();
        sub_block.template operator()<1>();
      };
      range.template operator()<0>();
      range.template operator()<1>();
      range.template operator()<2>();
      range.template operator()<3>();
    };
    half.template operator()<0>();
    half.template operator()<1>();
    simd::AddSuperBlock(acc, wb + kQ3_Kx8DAt, xb, isum);
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

template <bool kVnni>
constexpr GroupTileFn kGroupTiles[] = {&GroupTile<kVnni, 1>, &GroupTile<kVnni, 2>,
                                       &GroupTile<kVnni, 3>, &GroupTile<kVnni, 4>};

}  // namespace

template <bool kVnni>
void DotQ3_Kx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                   int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  RunGroupTiles(kGroupTiles<kVnni>, groups, n_groups, cols / kQK_K, x, x_stride, n_tokens, y,
                y_stride);
}

template void DotQ3_Kx8Avx2<false>(const RowSource&, int64_t, int64_t, const uint8_t*, int64_t,
                                   int64_t, float*, int64_t);
template void DotQ3_Kx8Avx2<true>(const RowSource&, int64_t, int64_t, const uint8_t*, int64_t,
                                  int64_t, float*, int64_t);

}  // namespace thermocline::matmul_internal
