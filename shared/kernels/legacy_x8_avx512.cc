// AVX-512 dot product of Q4_0, Q5_0 and Q8_0 weights in their 8-row interleaved layouts
// (shared/gguf/legacy_x8.h) against the activations of PrepareLegacyX8Avx2 (legacy_x8_avx2.cc).
//
// Why. A zmm holds two groups' 8 row lanes (interleaved8_avx512.h), so every step after the
// loads serves 16 rows: per block and token the AVX2 kernel's 8 maddubs, int16 adds, madds and
// bias add (Q8_0: 8 sign, maddubs, madd and add) become 8 vpdpbusd (the byte products and their
// int32 sum in one instruction), and the conversion, scale multiply and FMA are shared by twice
// the rows. vpdpbusd multiplies unsigned weight bytes: every type's planes are q_w + o (Q4_0's
// nibbles as they are, Q5_0's with the fifth bit or-ed in, Q8_0's bytes with the sign bit
// flipped) and the activations' bias takes the offset back out. With many tokens a tile is
// 2 groups x up to 8 tokens (8 weight registers, 8 accumulators), against AVX2's 1 x 4.
//
// Arithmetic. Per row and block the sum bias + sum (q_w + o) * q_x is the exact int32 the AVX2
// kernel forms (vpdpbusd does not saturate; nor does any int16 step there), and every lane adds
// it as acc = fma(fl(d_w * d_x), sum, acc) over the blocks in order: the avx2 family's bits.
#include <cstdint>
#include <cstring>

#include "shared/gguf/legacy_x8.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/legacy_x8_planes.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using avx512::Broadcast4;

// As in legacy_x8_avx2.cc: every 4 blocks, the 4 blocks 16 ahead.
constexpr int64_t kPrefetchEvery = 4;

// Block k of groups a (low half) and b (high half) into acc, for T tokens.
template <GgmlType kType, int T>
inline void PairStep(const uint8_t* a, const uint8_t* b, int64_t k, const uint8_t* x,
                     int64_t x_stride, __m512 (&acc)[T]) {
  using F = LegacyX8Format<kType>;
  constexpr int64_t kBlockBytes = F::kBlockBytes;
  const uint8_t* wa = a + k * kBlockBytes;
  const uint8_t* wb = b + k * kBlockBytes;
  if (k % kPrefetchEvery == 0) {
    avx512::PrefetchPair(wa, wb, 16 * kBlockBytes, kPrefetchEvery * kBlockBytes);
  }
  const __m512 wd = avx512::Halves2x8(wa, wb);
  __m512i u[8];
  avx512::UnpackLegacyPlanes<kType>(wa, wb, u);
  for (int t = 0; t < T; ++t) {
    const uint8_t* xb = x + t * x_stride + k * kLegacyX8InputBlockBytes;
    const uint8_t* xq = xb + 8;
    // Two chains of 4 (the bias starts one): half the latency of one chain of 8, which
    // alone bounds a one-token tile.
    __m512i s[2] = {Broadcast4(xb + 4), _mm512_setzero_si512()};
    for (int p = 0; p < 8; ++p) {
      s[p % 2] = _mm512_dpbusd_epi32(s[p % 2], u[p], Broadcast4(xq + F::PlaneElement(p)));
    }
    const __m512i s32 = _mm512_add_epi32(s[0], s[1]);
    const __m512 scale = _mm512_mul_ps(wd, avx512::BroadcastF32(xb));
    acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s32), acc[t]);
  }
}

// Groups a (low half) and b (high half), T tokens (avx512::PairFn).
template <GgmlType kType, int T>
void PairTile(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
              int64_t x_stride, float* ya, float* yb, int64_t y_stride) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n_blocks; ++k) PairStep<kType, T>(a, b, k, x, x_stride, acc);
  avx512::StoreTile(acc, ya, yb, y_stride);
}

// Pairs (g[0], g[1]) and (g[2], g[3]), one token, block by block in turn (avx512::QuadFn).
template <GgmlType kType>
void QuadTile(const uint8_t* const (&g)[4], int64_t n_blocks, const uint8_t* x,
              float* const (&y)[4]) {
  __m512 acc[2][1] = {{_mm512_setzero_ps()}, {_mm512_setzero_ps()}};
  for (int64_t k = 0; k < n_blocks; ++k) {
    PairStep<kType, 1>(g[0], g[1], k, x, 0, acc[0]);
    PairStep<kType, 1>(g[2], g[3], k, x, 0, acc[1]);
  }
  avx512::StoreTile(acc[0], y[0], y[1], 0);
  avx512::StoreTile(acc[1], y[2], y[3], 0);
}

template <GgmlType kType, int... T>
constexpr avx512::PairFn kPairTiles[] = {&PairTile<kType, T>...};

}  // namespace

template <GgmlType kType>
void DotLegacyX8Avx512(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  if (n_tokens == 1) {
    avx512::ForEachGroupQuad(&QuadTile<kType>, kPairTiles<kType, 1, 2, 3, 4, 5, 6, 7, 8>, groups,
                             n_groups, cols / kQK, x, y);
    return;
  }
  avx512::ForEachGroupPair(kPairTiles<kType, 1, 2, 3, 4, 5, 6, 7, 8>, groups, n_groups, cols / kQK,
                           x, x_stride, n_tokens, y, y_stride);
}

template void DotLegacyX8Avx512<GgmlType::kQ4_0>(const RowSource&, int64_t, int64_t, const uint8_t*,
                                                 int64_t, int64_t, float*, int64_t);
template void DotLegacyX8Avx512<GgmlType::kQ5_0>(const RowSource&, int64_t, int64_t, const uint8_t*,
                                                 int64_t, int64_t, float*, int64_t);
template void DotLegacyX8Avx512<GgmlType::kQ8_0>(const RowSource&, int64_t, int64_t, const uint8_t*,
                                                 int64_t, int64_t, float*, int64_t);

}  // namespace thermocline::matmul_internal
