// AVX-512 dot product of Q4_K (and Q5_K) weights in the 8-row interleaved layouts
// (shared/gguf/q4_kx8.h) against the activations of PrepareQ4_Kx8Avx2 (layout in
// matmul_kernels.h).
//
// Why. A zmm holds two groups' 8 row lanes (interleaved8_avx512.h), so the nibble masks, the
// scale widening and the float steps serve 16 rows, and the byte products need fewer
// instructions: where AVX2 forms a sub-block's sums with maddubs, int16 adds and a madd by the
// duplicated scales, here vpdpbusd sums 4 chunks' byte products (2 for Q5_K) into int32 lanes
// and one vpdpwssd multiplies them by the scale and adds them to the super-block's sum. With many
// tokens a tile is 2 groups x up to 8 tokens, against AVX2's 1 x 4.
//
// Arithmetic. A vpdpbusd lane of 4 chunks of 4-bit quants is at most 16 x 15 x 128 = 30720 in
// magnitude, of 2 chunks of 5-bit ones 8 x 31 x 128 = 31744: below 2^15, so as the low int16 of
// an int32 lane (the high one its sign) it meets the scale pair (sc, 0) in vpdpwssd exactly.
// The super-block's I and M are therefore the exact int32 the AVX2 kernel forms, and every lane
// adds them as it does: acc = fma(fl(d * xd), fl(I), acc), acc = fma(-fl(dmin * xd), fl(M),
// acc), super-blocks in order: the avx2 family's bits.
#include <cstdint>

#include "shared/gguf/q4_kx8.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using avx512::BitTo4;
using avx512::Broadcast4;

// From 16 bytes per group of scale pairs, row r's two at 2r, 2r + 1: lane r of each
// half as int32 (first, 0) and (second, 0) in int16 pairs, which vpdpwssd multiplies an int32
// lane below 2^15 in magnitude by exactly.
struct ScalePairs {
  __m512i first, second;
};
inline ScalePairs WidenPairs(const uint8_t* a, const uint8_t* b) {
  const __m256i bytes = avx512::Load2x16(a, b);
  const __m512i w = _mm512_cvtepu8_epi16(bytes);
  return {_mm512_and_si512(w, _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(w, 16)};
}

// Groups a (low half) and b (high half), T tokens (avx512::PairFn); kHigh: Q5_K.
template <bool kHigh, int T>
void PairTile(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
              int64_t x_stride, float* ya, float* yb, int64_t y_stride) {
  constexpr int64_t kBlock = kHigh ? kQ5_Kx8BlockBytes : kQ4_Kx8BlockBytes;
  constexpr int64_t kQs = kHigh ? kQ5_Kx8QsAt : kQ4_Kx8QsAt;
  constexpr int kChunksPerScale = kHigh ? 2 : 4;  // the bound above
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n_blocks; ++k) {
    const uint8_t* wa = a + k * kBlock;
    const uint8_t* wb = b + k * kBlock;
    avx512::PrefetchPair(wa, wb, 2 * kBlock, kBlock);  // two super-blocks ahead, as AVX2
    const uint8_t* xb[T];
    __m512i isum[T];
    for (int t = 0; t < T; ++t) {
      xb[t] = x + t * x_stride + k * kQ4_Kx8InputBlockBytes;
      isum[t] = _mm512_setzero_si512();
    }
    // Sub-blocks 2G (low nibbles) and 2G + 1 (high nibbles); G a template parameter so that
    // Q5_K's bit shifts are immediates.
    auto sub_block_pair = [&]<int G>() {
      const ScalePairs sc =
          WidenPairs(wa + kQ4_Kx8ScalesAt + 16 * G, wb + kQ4_Kx8ScalesAt + 16 * G);
      for (int c0 = 0; c0 < 8; c0 += kChunksPerScale) {
        __m512i lo[kChunksPerScale], hi[kChunksPerScale];
        for (int c = 0; c < kChunksPerScale; ++c) {
          const int64_t at = kQs + 32 * (8 * G + c0 + c);
          const __m512i v = avx512::Load2x32(wa + at, wb + at);
          lo[c] = _mm512_and_si512(v, low);
          hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
          if constexpr (kHigh) {
            const int64_t qh_at = kQ5_Kx8QhAt + 32 * (c0 + c);
            const __m512i qh = avx512::Load2x32(wa + qh_at, wb + qh_at);
            lo[c] = _mm512_or_si512(lo[c], BitTo4<2 * G>(qh));
            hi[c] = _mm512_or_si512(hi[c], BitTo4<2 * G + 1>(qh));
          }
        }
        for (int t = 0; t < T; ++t) {
          const uint8_t* xq = xb[t] + 64 * G + 4 * c0;
          __m512i pl = _mm512_setzero_si512(), ph = _mm512_setzero_si512();
          for (int c = 0; c < kChunksPerScale; ++c) {
            pl = _mm512_dpbusd_epi32(pl, lo[c], Broadcast4(xq + 4 * c));
            ph = _mm512_dpbusd_epi32(ph, hi[c], Broadcast4(xq + 32 + 4 * c));
          }
          isum[t] = _mm512_dpwssd_epi32(isum[t], pl, sc.first);
          isum[t] = _mm512_dpwssd_epi32(isum[t], ph, sc.second);
        }
      }
    };
    sub_block_pair.template operator()<0>();
    sub_block_pair.template operator()<1>();
    sub_block_pair.template operator()<2>();
    sub_block_pair.template operator()<3>();
    // Mins as int16 pairs (lane r: row r's two), meeting the activation's sub-block sum pairs.
    __m512i mins[4];
    for (int p = 0; p < 4; ++p) {
      const int64_t at = kQ4_Kx8MinsAt + 16 * p;
      mins[p] = _mm512_cvtepu8_epi16(avx512::Load2x16(wa + at, wb + at));
    }
    const __m512 d = avx512::Halves2x8(wa + kQ4_Kx8DAt, wb + kQ4_Kx8DAt);
    const __m512 dmin = avx512::Halves2x8(wa + kQ4_Kx8DminAt, wb + kQ4_Kx8DminAt);
    for (int t = 0; t < T; ++t) {
      const uint8_t* xs = xb[t] + kQ4_Kx8InputSumsAt;
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) msum = _mm512_dpwssd_epi32(msum, mins[p], Broadcast4(xs + 4 * p));
      const __m512 xd = avx512::BroadcastF32(xb[t] + kQ4_Kx8InputDAt);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(isum[t]), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(msum), acc[t]);
    }
  }
  avx512::StoreTile(acc, ya, yb, y_stride);
}

template <bool kHigh, int... T>
constexpr avx512::PairFn kPairTiles[] = {&PairTile<kHigh, T>...};

template <bool kHigh>
void Dot(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
         int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  avx512::ForEachGroupPair(kPairTiles<kHigh, 1, 2, 3, 4, 5, 6, 7, 8>, groups, n_groups,
                           cols / kQK_K, x, x_stride, n_tokens, y, y_stride);
}

}  // namespace

void DotQ4_Kx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  Dot<false>(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
}

void DotQ5_Kx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  Dot<true>(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
