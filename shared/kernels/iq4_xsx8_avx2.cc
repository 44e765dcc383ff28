// AVX2 dot product of IQ4_XS weights in the 8-row interleaved layout (shared/gguf/iq4_xsx8.h)
// against plain Q8_K activations: a group's 8 rows in the 8 lanes of a ymm.
//
// The IQ4_NL values are signed, and maddubs wants its unsigned operand on the weights' side, so
// each chunk's values come as magnitudes (a byte shuffle of the table's absolute values) and
// their signs go onto the activations (vpsignb; no value is 0). Two products of at most 127 x 127
// make one exact int16 (32258), widened to int32 per lane (4 elements) by madd with ones; a
// sub-block's sum then takes its scale with one 32-bit multiply. With AVX-VNNI (kVnni) one byte
// shuffle gives value + 128 (unsigned) and vpdpbusd sums its products with the activations into
// the lanes directly; the + 128 comes back out per sub-block as 128 x its activation sum (two
// bsums), as in the AVX-512 kernel.
//
// Arithmetic. Per row the super-block's I is DotIq4_XSx8Portable's exact int32, added as it adds
// it: bit-identical to it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "shared/gguf/iq4_xsx8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"
#include "shared/kernels/simd_avx2.h"

namespace thermocline::matmul_internal {
namespace {

using simd::Broadcast4;
using simd::Load32;

// A group is one sequential stream, prefetched two super-blocks ahead (as Q4_K's).
constexpr int64_t kPrefetchAhead = 2 * kIq4_XSx8BlockBytes;

constexpr int64_t kXq = 4, kXBsums = 4 + kQK_K;  // block_q8_K: f32 d, int8 qs[256], bsums[16]

// The IQ4_NL values + 128, for vpdpbusd's unsigned operand.
alignas(16) constexpr uint8_t kShiftedValues[16] = {1,   24,  45,  63,  79,  93,  106, 118,
                                                    129, 141, 153, 166, 181, 197, 217, 241};
static_assert(kShiftedValues[0] == kIq4nlValues[0] + 128 &&
              kShiftedValues[15] == kIq4nlValues[15] + 128);

// Sub-block s's scale per lane (row), from the row's scales_l word and widened scales_h: the
// low nibble at bit 4s, the two high bits at bit 2s, minus 32.
inline __m256i SubBlockScale(__m256i sl, __m256i sh, int s) {
  const __m256i low = _mm256_and_si256(_mm256_srli_epi32(sl, 4 * s), _mm256_set1_epi32(0x0F));
  const __m256i high =
      _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * s), _mm256_set1_epi32(3)), 4);
  return _mm256_sub_epi32(_mm256_or_si256(low, high), _mm256_set1_epi32(32));
}

// y[t * y_stride + i] for the group's 8 rows i and T tokens.
template <bool kVnni, int T>
void GroupTile(const uint8_t* group, int64_t n_blocks, const uint8_t* x, int64_t x_stride, float* y,
               int64_t y_stride) {
  const __m256i values =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  const __m256i magnitudes = _mm256_abs_epi8(values);
  const __m256i shifted =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kShiftedValues)));
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* wb = group + b * kIq4_XSx8BlockBytes;
    for (int64_t at = 0; at < kIq4_XSx8BlockBytes; at += 64) {
      PrefetchWeights(wb + kPrefetchAhead + at);
    }
    const uint8_t* xb[T];
    __m256i isum[T];
    alignas(32) int32_t offset[T][8];  // kVnni: 128 x each sub-block's activation sum
    for (int t = 0; t < T; ++t) {
      xb[t] = x + t * x_stride + b * kQ8KBlockBytes;
      isum[t] = _mm256_setzero_si256();
      if constexpr (kVnni) {
        const __m256i sums =
            _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[t] + kXBsums)),
                              _mm256_set1_epi16(1));
        _mm256_store_si256(reinterpret_cast<__m256i*>(offset[t]), _mm256_slli_epi32(sums, 7));
      }
    }
    const __m256i sl = Load32(wb + kIq4_XSx8ScalesLAt);
    const __m256i sh = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kIq4_XSx8ScalesHAt)));
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      __m256i sum[T];
      for (int t = 0; t < T; ++t) sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256i v = Load32(wb + kIq4_XSx8QsAt + 32 * (4 * s + c));
        const __m256i lo_idx = _mm256_and_si256(v, low);
        const __m256i hi_idx = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if constexpr (kVnni) {
          const __m256i lo_u = _mm256_shuffle_epi8(shifted, lo_idx);
          const __m256i hi_u = _mm256_shuffle_epi8(shifted, hi_idx);
          for (int t = 0; t < T; ++t) {
            const uint8_t* xq = xb[t] + kXq + 32 * s + 4 * c;
            sum[t] = simd::DpbusdVex(sum[t], lo_u, Broadcast4(xq));
            sum[t] = simd::DpbusdVex(sum[t], hi_u, Broadcast4(xq + 16));
          }
          continue;
        }
        const __m256i lo_val = _mm256_shuffle_epi8(values, lo_idx);
        const __m256i hi_val = _mm256_shuffle_epi8(values, hi_idx);
        const __m256i lo_mag = _mm256_shuffle_epi8(magnitudes, lo_idx);
        const __m256i hi_mag = _mm256_shuffle_epi8(magnitudes, hi_idx);
        for (int t = 0; t < T; ++t) {
          const uint8_t* xq = xb[t] + kXq + 32 * s + 4 * c;
          const __m256i lo = _mm256_maddubs_epi16(lo_mag, _mm256_sign_epi8(Broadcast4(xq), lo_val));
          const __m256i hi =
              _mm256_maddubs_epi16(hi_mag, _mm256_sign_epi8(Broadcast4(xq + 16), hi_val));
          sum[t] = _mm256_add_epi32(
              sum[t], _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones)));
        }
      }
      const __m256i sc = SubBlockScale(sl, sh, s);
      for (int t = 0; t < T; ++t) {
        if constexpr (kVnni) sum[t] = _mm256_sub_epi32(sum[t], _mm256_set1_epi32(offset[t][s]));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(sum[t], sc));
      }
    }
    simd::AddSuperBlock(acc, wb + kIq4_XSx8DAt, xb, isum);
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * y_stride, acc[t]);
}

template <bool kVnni>
constexpr GroupTileFn kGroupTiles[] = {&GroupTile<kVnni, 1>, &GroupTile<kVnni, 2>,
                                       &GroupTile<kVnni, 3>, &GroupTile<kVnni, 4>};

}  // namespace

template <bool kVnni>
void DotIq4_XSx8Avx2(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  RunGroupTiles(kGroupTiles<kVnni>, groups, n_groups, cols / kQK_K, x, x_stride, n_tokens, y,
                y_stride);
}

template void DotIq4_XSx8Avx2<false>(const RowSource&, int64_t, int64_t, const uint8_t*, int64_t,
                                     int64_t, float*, int64_t);
template void DotIq4_XSx8Avx2<true>(const RowSource&, int64_t, int64_t, const uint8_t*, int64_t,
                                    int64_t, float*, int64_t);

}  // namespace thermocline::matmul_internal
