// AVX-512 dot product of IQ4_XS weights in the 8-row interleaved layout (shared/gguf/iq4_xsx8.h)
// against plain Q8_K activations: two groups per zmm (interleaved8_avx512.h).
//
// Why. The IQ4_NL values are signed, and the row kernel (Iq4xsInt in kquant_avx512.cc) moves
// their signs onto the activations (two masks and two blends per 64 weight bytes) before its
// maddubs and vpdpwssd. Here one byte shuffle gives each quant's value + 128 (1..241, unsigned)
// and vpdpbusd multiplies it with the activation straight into a row's int32 lane; the +128
// comes back out once per sub-block and token as 128 x its activation sum (from the bsums), and
// one vpmulld applies the scale. Every broadcast serves 16 rows.
//
// Arithmetic. Per row the super-block's I is DotIq4_XSx8Portable's exact int32 (every partial
// sum below 2^27 in magnitude), added as it adds it: the portable and avx2 families' bits.
#include <cstdint>

#include "shared/gguf/iq4_xsx8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using avx512::Broadcast4;

// block_q8_K offsets: f32 d, int8 qs[256], int16 bsums[16].
constexpr int64_t kXq = 4, kXBsums = 4 + kQK_K;

// Sub-block kS's scale per lane (row) from the row's scales_l word and widened scales_h: the
// low nibble at bit 4kS, the two high bits at bit 2kS, minus 32.
template <int kS>
inline __m512i SubBlockScale(__m512i sl, __m512i sh) {
  const __m512i low = _mm512_srli_epi32(sl, 4 * kS);
  const __m512i high =
      kS < 2 ? _mm512_slli_epi32(sh, 4 - 2 * kS) : _mm512_srli_epi32(sh, 2 * kS - 4);
  // (low & 0x0F) | (high & 0x30), then the offset.
  const __m512i ls = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0x0F), low, high, 0xCA);
  return _mm512_sub_epi32(_mm512_and_si512(ls, _mm512_set1_epi32(0x3F)), _mm512_set1_epi32(32));
}

// Groups a (low half) and b (high half), T tokens (avx512::PairFn).
template <int T>
void PairTile(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
              int64_t x_stride, float* ya, float* yb, int64_t y_stride) {
  alignas(16) static constexpr uint8_t kShifted[16] = {1,   24,  45,  63,  79,  93,  106, 118,
                                                       129, 141, 153, 166, 181, 197, 217, 241};
  static_assert(kShifted[0] == kIq4nlValues[0] + 128 && kShifted[15] == kIq4nlValues[15] + 128);
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kShifted)));
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n_blocks; ++k) {
    const uint8_t* wa = a + k * kIq4_XSx8BlockBytes;
    const uint8_t* wb = b + k * kIq4_XSx8BlockBytes;
    avx512::PrefetchPair(wa, wb, 2 * kIq4_XSx8BlockBytes, kIq4_XSx8BlockBytes);  // as Q6_K's
    const uint8_t* xb[T];
    __m512i isum[T];
    // 128 x each sub-block's activation sum, per token: what the + 128 of the values adds.
    alignas(64) int32_t offset[T][8];
    for (int t = 0; t < T; ++t) {
      xb[t] = x + t * x_stride + k * kQ8KBlockBytes;
      isum[t] = _mm512_setzero_si512();
      const __m256i sums =
          _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[t] + kXBsums)),
                            _mm256_set1_epi16(1));
      _mm256_store_si256(reinterpret_cast<__m256i*>(offset[t]), _mm256_slli_epi32(sums, 7));
    }
    const __m512i sl = avx512::Load2x32(wa + kIq4_XSx8ScalesLAt, wb + kIq4_XSx8ScalesLAt);
    const __m512i sh =
        _mm512_cvtepu16_epi32(avx512::Load2x16(wa + kIq4_XSx8ScalesHAt, wb + kIq4_XSx8ScalesHAt));
    auto sub_block = [&]<int kS>() {
      __m512i lo_sum[T], hi_sum[T];
      for (int t = 0; t < T; ++t) lo_sum[t] = hi_sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const int64_t at = kIq4_XSx8QsAt + 32 * (4 * kS + c);
        const __m512i v = avx512::Load2x32(wa + at, wb + at);
        const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, low));
        const __m512i hi =
            _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
        for (int t = 0; t < T; ++t) {
          const uint8_t* xq = xb[t] + kXq + 32 * kS + 4 * c;
          lo_sum[t] = _mm512_dpbusd_epi32(lo_sum[t], lo, Broadcast4(xq));
          hi_sum[t] = _mm512_dpbusd_epi32(hi_sum[t], hi, Broadcast4(xq + 16));
        }
      }
      const __m512i sc = SubBlockScale<kS>(sl, sh);
      for (int t = 0; t < T; ++t) {
        const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(lo_sum[t], hi_sum[t]),
                                             _mm512_set1_epi32(offset[t][kS]));
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sum, sc));
      }
    };
    sub_block.template operator()<0>();
    sub_block.template operator()<1>();
    sub_block.template operator()<2>();
    sub_block.template operator()<3>();
    sub_block.template operator()<4>();
    sub_block.template operator()<5>();
    sub_block.template operator()<6>();
    sub_block.template operator()<7>();
    avx512::AddSuperBlock(acc, wa + kIq4_XSx8DAt, wb + kIq4_XSx8DAt, xb, isum);
  }
  avx512::StoreTile(acc, ya, yb, y_stride);
}

template <int... T>
constexpr avx512::PairFn kPairTiles[] = {&PairTile<T>...};

}  // namespace

void DotIq4_XSx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  avx512::ForEachGroupPair(kPairTiles<1, 2, 3, 4, 5, 6, 7, 8>, groups, n_groups, cols / kQK_K, x,
                           x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
