// AVX-512 dot product of Q3_K weights in the 8-row interleaved layout (shared/gguf/q3_kx8.h)
// against plain Q8_K activations: two groups per zmm (interleaved8_avx512.h).
//
// Why. The row kernel (Q3KInt in kquant_avx512.cc) assembles each 3-bit quant for two rows at a
// time and takes the products through maddubs and vpdpwssd. Here the assembly (two low bits
// shifted down, the third bit shifted to bit 2, one ternary-logic merge) serves 16 rows, the
// unsigned quants 0..7 meet the activations in vpdpbusd straight into each row's int32 lane, the
// -4 comes out once per sub-block as 4 x its bsum, and one vpmulld applies the sub-block's scale,
// decoded per lane from the row's three packed scale words.
//
// Arithmetic. Per row the super-block's I is DotQ3_Kx8Portable's exact int32, added as it adds
// it: the portable and avx2 families' bits.
#include <cstdint>

#include "shared/gguf/q3_kx8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using avx512::Broadcast4;

// block_q8_K offsets: f32 d, int8 qs[256], int16 bsums[16].
constexpr int64_t kXq = 4, kXBsums = 4 + kQK_K;

// Sub-block kS's scale per lane from the row's packed words w[0..2] (q3_kx8_avx2.cc).
template <int kS>
inline __m512i SubBlockScale(const __m512i (&w)[3]) {
  constexpr int kLowShift = 8 * (kS % 4) + (kS >= 8 ? 4 : 0);
  constexpr int kHighShift = 8 * (kS % 4) + 2 * (kS / 4);
  const __m512i low = _mm512_srli_epi32(w[(kS % 8) / 4], kLowShift);
  const __m512i high = kHighShift >= 4 ? _mm512_srli_epi32(w[2], kHighShift - 4)
                                       : _mm512_slli_epi32(w[2], 4 - kHighShift);
  // (low & 0x0F) | (high & ~0x0F), then the 6 bits and the offset.
  const __m512i ls = _mm512_ternarylogic_epi32(_mm512_set1_epi32(0x0F), low, high, 0xCA);
  return _mm512_sub_epi32(_mm512_and_si512(ls, _mm512_set1_epi32(0x3F)), _mm512_set1_epi32(32));
}

// The third quant bit of element range kJ of half kH (bit 4 kH + kJ of each hmask byte) at bit
// 2, other bits arbitrary (the merge below keeps bit 2 alone).
template <int kH, int kJ>
inline __m512i ThirdBit(__m512i hm) {
  constexpr int kBit = 4 * kH + kJ;
  if constexpr (kBit < 2) return _mm512_slli_epi16(hm, 2 - kBit);
  if constexpr (kBit == 2) return hm;
  if constexpr (kBit > 2) return _mm512_srli_epi16(hm, kBit - 2);
}

// Groups a (low half) and b (high half), T tokens (avx512::PairFn).
template <int T>
void PairTile(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
              int64_t x_stride, float* ya, float* yb, int64_t y_stride) {
  const __m512i three = _mm512_set1_epi8(3), seven = _mm512_set1_epi8(7);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n_blocks; ++k) {
    const uint8_t* wa = a + k * kQ3_Kx8BlockBytes;
    const uint8_t* wb = b + k * kQ3_Kx8BlockBytes;
    avx512::PrefetchPair(wa, wb, 2 * kQ3_Kx8BlockBytes, kQ3_Kx8BlockBytes);  // as Q6_K's
    const uint8_t* xb[T];
    __m512i isum[T];
    alignas(64) int32_t offset[T][16];  // 4 x each sub-block's activation sum
    for (int t = 0; t < T; ++t) {
      xb[t] = x + t * x_stride + k * kQ8KBlockBytes;
      isum[t] = _mm512_setzero_si512();
      const __m512i sums = _mm512_cvtepi16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[t] + kXBsums)));
      _mm512_store_si512(offset[t], _mm512_slli_epi32(sums, 2));
    }
    __m512i w[3];
    for (int i = 0; i < 3; ++i) {
      w[i] = avx512::Load2x32(wa + kQ3_Kx8ScalesAt + 32 * i, wb + kQ3_Kx8ScalesAt + 32 * i);
    }
    __m512i hm[8];
    for (int c = 0; c < 8; ++c) {
      hm[c] = avx512::Load2x32(wa + kQ3_Kx8HmaskAt + 32 * c, wb + kQ3_Kx8HmaskAt + 32 * c);
    }
    auto half = [&]<int kH>() {
      __m512i qs[8];
      for (int c = 0; c < 8; ++c) {
        const int64_t at = kQ3_Kx8QsAt + 32 * (8 * kH + c);
        qs[c] = avx512::Load2x32(wa + at, wb + at);
      }
      auto range = [&]<int kJ>() {
        auto sub_block = [&]<int kU>() {
          constexpr int kS = 8 * kH + 2 * kJ + kU;
          __m512i sum[T];
          for (int t = 0; t < T; ++t) sum[t] = _mm512_setzero_si512();
          for (int c = 4 * kU; c < 4 * kU + 4; ++c) {
            // (low two bits & 3) | (third bit & ~3), then & 7.
            const __m512i merged = _mm512_ternarylogic_epi32(
                three, _mm512_srli_epi16(qs[c], 2 * kJ), ThirdBit<kH, kJ>(hm[c]), 0xCA);
            const __m512i q = _mm512_and_si512(merged, seven);
            for (int t = 0; t < T; ++t) {
              sum[t] = _mm512_dpbusd_epi32(sum[t], q,
                                           Broadcast4(xb[t] + kXq + 128 * kH + 32 * kJ + 4 * c));
            }
          }
          const __m512i sc = SubBlockScale<kS>(w);
          for (int t = 0; t < T; ++t) {
            const __m512i centred = _mm512_sub_epi32(sum[t], _mm512_set1_epi32(offset[t][kS]));
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(centred, sc));
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
    avx512::AddSuperBlock(acc, wa + kQ3_Kx8DAt, wb + kQ3_Kx8DAt, xb, isum);
  }
  avx512::StoreTile(acc, ya, yb, y_stride);
}

template <int... T>
constexpr avx512::PairFn kPairTiles[] = {&PairTile<T>...};

}  // namespace

void DotQ3_Kx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  avx512::ForEachGroupPair(kPairTiles<1, 2, 3, 4, 5, 6, 7, 8>, groups, n_groups, cols / kQK_K, x,
                           x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
