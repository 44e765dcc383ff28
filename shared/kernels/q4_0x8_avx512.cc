// AVX-512 dot product of Q4_0 weights in the 8-row interleaved layout (shared/gguf/q4_0x8.h)
// against the activations of PrepareQ4_0x8Avx2 (q4_0x8_avx2.cc).
//
// Why. A zmm holds two groups' 8 row lanes (interleaved8_avx512.h), so every step after the
// loads serves 16 rows: per block and token the AVX2 kernel's 8 maddubs, 7 int16 adds, a madd
// and a bias add become 8 vpdpbusd (the byte products and their int32 sum in one instruction),
// and the conversion, scale multiply and FMA are shared by twice the rows. With many tokens a
// tile is 2 groups x up to 8 tokens (8 weight registers, 8 accumulators), against AVX2's 1 x 4.
//
// Arithmetic. Per row and block the sum bias + sum (nibble * q_x) is the exact int32 AVX2
// forms with maddubs (no int16 step saturates there, 8 x 2 x 15 x 128 < 2^15), and every lane
// adds it as acc = fma(fl(d_w * d_x), sum, acc) over the blocks in order: the avx2 family's bits.
#include <cstdint>
#include <cstring>

#include "shared/gguf/q4_0x8.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using avx512::Broadcast4;

// As in q4_0x8_avx2.cc: every 4 blocks, the 4 blocks 16 ahead.
constexpr int64_t kPrefetchEvery = 4;
constexpr int64_t kPrefetchAhead = 16 * kQ4_0x8BlockBytes;

// Groups a (low half) and b (high half), T tokens (avx512::PairFn).
template <int T>
void PairTile(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
              int64_t x_stride, float* ya, float* yb, int64_t y_stride) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n_blocks; ++k) {
    const uint8_t* wa = a + k * kQ4_0x8BlockBytes;
    const uint8_t* wb = b + k * kQ4_0x8BlockBytes;
    if (k % kPrefetchEvery == 0) {
      avx512::PrefetchPair(wa, wb, kPrefetchAhead, kPrefetchEvery * kQ4_0x8BlockBytes);
    }
    const __m512 wd = avx512::Halves2x8(wa, wb);
    __m512i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) {
      const int64_t at = kQ4_0x8ScaleBytes + 32 * c;
      const __m512i v = avx512::Load2x32(wa + at, wb + at);
      lo[c] = _mm512_and_si512(v, low);
      hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    for (int t = 0; t < T; ++t) {
      const uint8_t* xb = x + t * x_stride + k * kQ4_0x8InputBlockBytes;
      const uint8_t* xq = xb + 8;
      __m512i s32 = Broadcast4(xb + 4);  // the bias
      for (int c = 0; c < 4; ++c) {
        s32 = _mm512_dpbusd_epi32(s32, lo[c], Broadcast4(xq + 4 * c));
        s32 = _mm512_dpbusd_epi32(s32, hi[c], Broadcast4(xq + 16 + 4 * c));
      }
      const __m512 scale = _mm512_mul_ps(wd, avx512::BroadcastF32(xb));
      acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s32), acc[t]);
    }
  }
  avx512::StoreTile(acc, ya, yb, y_stride);
}

template <int... T>
constexpr avx512::PairFn kPairTiles[] = {&PairTile<T>...};

}  // namespace

void DotQ4_0x8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                     int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  avx512::ForEachGroupPair(kPairTiles<1, 2, 3, 4, 5, 6, 7, 8>, groups, n_groups, cols / kQK, x,
                           x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
