// AVX-512 dot product of Q6_K weights in the 8-row interleaved layout (shared/gguf/q6_kx8.h)
// against plain Q8_K activations (PrepareQ6_Kx8Avx2).
//
// Why. A zmm holds two groups' 8 row lanes (interleaved8_avx512.h), so the per-row bit assembly
// of the 6-bit quants (nibble, two high bits: the bulk of Q6_K's work) is done for 16 rows per
// instruction, and a sub-block's byte products need fewer: 4 vpdpbusd sum its 4 chunks into
// int32 lanes and one vpmulld applies the scale, where AVX2 spends 4 maddubs, 2 int16 adds, 2
// madd and 2 int32 adds. The +32 offset of the stored quants goes straight into the same sum: one
// vpdpwssd of the scale pair times -32 with the activation's bsums pair. With many tokens a tile
// is 2 groups x up to 8 tokens, against AVX2's 1 x 4.
//
// Arithmetic. Per row and super-block I = sum_s sc_s * sum_{l in s} (q_l - 32) xq_l is the exact
// int32 the AVX2 kernel forms (every partial sum below 2^30 in magnitude), added by every lane
// as acc = fma(fl(d * xd), fl(I), acc), super-blocks in order: the avx2 family's bits.
#include <cstdint>

#include "shared/gguf/q6_kx8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using avx512::Broadcast4;

// block_q8_K offsets: f32 d, int8 qs[256], int16 bsums[16].
constexpr int64_t kXq = 4, kXBsums = 4 + kQK_K;

// Bits 4-5 of every byte: the quant's top 2 bits for element range j (0..3) of a qh chunk, whose
// bytes hold them in bits 2j, 2j + 1.
template <int kJ>
inline __m512i HighBits(__m512i qh) {
  const __m512i mask = _mm512_set1_epi8(0x30);
  if constexpr (kJ < 2) return _mm512_and_si512(_mm512_slli_epi16(qh, 4 - 2 * kJ), mask);
  if constexpr (kJ == 2) return _mm512_and_si512(qh, mask);
  if constexpr (kJ == 3) return _mm512_and_si512(_mm512_srli_epi16(qh, 2), mask);
}

// Groups a (low half) and b (high half), T tokens (avx512::PairFn).
template <int T>
void PairTile(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
              int64_t x_stride, float* ya, float* yb, int64_t y_stride) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n_blocks; ++k) {
    const uint8_t* wa = a + k * kQ6_Kx8BlockBytes;
    const uint8_t* wb = b + k * kQ6_Kx8BlockBytes;
    avx512::PrefetchPair(wa, wb, 2 * kQ6_Kx8BlockBytes, kQ6_Kx8BlockBytes);  // as AVX2
    const uint8_t* xb[T];
    __m512i isum[T];
    for (int t = 0; t < T; ++t) {
      xb[t] = x + t * x_stride + k * kQ8KBlockBytes;
      isum[t] = _mm512_setzero_si512();
    }
    // Elements 128h + 32j .. + 31: sub-blocks 8h + 2j (chunks 0..3) and 8h + 2j + 1 (4..7);
    // h and j template parameters so that the nibble and high-bit shifts are immediates.
    // Element ranges J and J + 2 of half H (the low and the high nibbles of the same ql chunks,
    // bit pairs J and J + 2 of the same qh chunks) together, so that each chunk is loaded once;
    // H and J template parameters so that the shifts are immediates.
    auto range_pair = [&]<int H, int J>() {
      // Per range, lane r: row r's int16 scale pair as int32 first and second, and the pair
      // times -32, which meets the bsums pair to take the offset out.
      __m512i sc[2][2];
      for (int i = 0; i < 2; ++i) {
        const int p = 4 * H + J + 2 * i;
        const int64_t sc_at = kQ6_Kx8ScalesAt + 16 * p;
        const __m512i pair = _mm512_cvtepi8_epi16(avx512::Load2x16(wa + sc_at, wb + sc_at));
        sc[i][0] = _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16);
        sc[i][1] = _mm512_srai_epi32(pair, 16);
        const __m512i offset = _mm512_mullo_epi16(pair, _mm512_set1_epi16(-32));
        for (int t = 0; t < T; ++t) {
          isum[t] = _mm512_dpwssd_epi32(isum[t], offset, Broadcast4(xb[t] + kXBsums + 4 * p));
        }
      }
      const int64_t ql_at = kQ6_Kx8QlAt + 32 * (16 * H + 8 * J);
      const int64_t qh_at = kQ6_Kx8QhAt + 32 * (8 * H);
      for (int s = 0; s < 2; ++s) {
        __m512i q[2][4];
        for (int c = 0; c < 4; ++c) {
          const int64_t at = 32 * (4 * s + c);
          const __m512i v = avx512::Load2x32(wa + ql_at + at, wb + ql_at + at);
          const __m512i qh = avx512::Load2x32(wa + qh_at + at, wb + qh_at + at);
          q[0][c] = _mm512_or_si512(_mm512_and_si512(v, low), HighBits<J>(qh));
          q[1][c] =
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), HighBits<J + 2>(qh));
        }
        for (int t = 0; t < T; ++t) {
          for (int i = 0; i < 2; ++i) {
            const uint8_t* xq = xb[t] + kXq + 128 * H + 32 * (J + 2 * i) + 16 * s;
            __m512i sum = _mm512_setzero_si512();
            for (int c = 0; c < 4; ++c) {
              sum = _mm512_dpbusd_epi32(sum, q[i][c], Broadcast4(xq + 4 * c));
            }
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sum, sc[i][s]));
          }
        }
      }
    };
    range_pair.template operator()<0, 0>();
    range_pair.template operator()<0, 1>();
    range_pair.template operator()<1, 0>();
    range_pair.template operator()<1, 1>();
    avx512::AddSuperBlock(acc, wa + kQ6_Kx8DAt, wb + kQ6_Kx8DAt, xb, isum);
  }
  avx512::StoreTile(acc, ya, yb, y_stride);
}

template <int... T>
constexpr avx512::PairFn kPairTiles[] = {&PairTile<T>...};

}  // namespace

void DotQ6_Kx8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  avx512::ForEachGroupPair(kPairTiles<1, 2, 3, 4, 5, 6, 7, 8>, groups, n_groups, cols / kQK_K, x,
                           x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
