// What the AVX-512 kernels of the 8-row interleaved layouts (legacy_x8_avx512.cc,
// q4_kx8_avx512.cc, q6_kx8_avx512.cc) share: a zmm holds two groups side by side (the low half
// one group's 8 row lanes, the high half another's), so every lane sees the operations the AVX2
// kernel gives its row and the results are the avx2 family's bits. Include only from *_avx512.cc
// files.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"

namespace thermocline::matmul_internal::avx512 {

inline constexpr int64_t kGroupRows = 8;  // every interleaved layout's rows per group

// 32 bytes at a in the low half, 32 bytes at b in the high half.
inline __m512i Load2x32(const uint8_t* a, const uint8_t* b) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// 16 bytes at a in the low half, 16 bytes at b in the high half.
inline __m256i Load2x16(const uint8_t* a, const uint8_t* b) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
}

// The 8 fp16 values at a (low half) and at b (high half) as f32.
inline __m512 Halves2x8(const uint8_t* a, const uint8_t* b) {
  return _mm512_cvtph_ps(Load2x16(a, b));
}

// 4 bytes at p in every 32-bit lane (a load, no shuffle).
inline __m512i Broadcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Bit kBit of every byte of v moved to bit 4 (Q5_K's fifth quant bit), other bits zero.
template <int kBit>
inline __m512i BitTo4(__m512i v) {
  const __m512i mask = _mm512_set1_epi8(0x10);
  if constexpr (kBit < 4) return _mm512_and_si512(_mm512_slli_epi16(v, 4 - kBit), mask);
  if constexpr (kBit == 4) return _mm512_and_si512(v, mask);
  if constexpr (kBit > 4) return _mm512_and_si512(_mm512_srli_epi16(v, kBit - 4), mask);
}

// The f32 at p in every lane.
inline __m512 BroadcastF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_ps(v);
}

// The lines of [a + ahead, a + ahead + bytes) and the same of b (unless b is a): each
// group is a sequential stream that the hardware prefetcher alone does not keep far enough ahead
// at one thread (the AVX2 kernels' measurements). Past the matrix it is a harmless hint.
inline void PrefetchPair(const uint8_t* a, const uint8_t* b, int64_t ahead, int64_t bytes) {
  for (int64_t at = ahead; at < ahead + bytes; at += 64) {
    PrefetchWeights(a + at);
    if (b != a) PrefetchWeights(b + at);
  }
}

// The end of a super-block in the kernels whose rows each form one exact int32 I per super-block
// (Q3_K, Q6_K, IQ4_XS): acc[t] = fma(fl(d * xd_t), fl(I_t), acc[t]) for the 16 rows' fp16 d at
// da (group a) and db (group b), token t's Q8_K block at xb[t].
template <int T>
inline void AddSuperBlock(__m512 (&acc)[T], const uint8_t* da, const uint8_t* db,
                          const uint8_t* const (&xb)[T], const __m512i (&isum)[T]) {
  const __m512 d = Halves2x8(da, db);
  for (int t = 0; t < T; ++t) {
    acc[t] =
        _mm512_fmadd_ps(_mm512_mul_ps(d, BroadcastF32(xb[t])), _mm512_cvtepi32_ps(isum[t]), acc[t]);
  }
}

// acc[t]'s low half to ya + t * y_stride, its high half to yb + t * y_stride (none if yb is
// nullptr).
template <int T>
inline void StoreTile(const __m512 (&acc)[T], float* ya, float* yb, int64_t y_stride) {
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(ya + t * y_stride, 0x00FF, acc[t]);  // the low 8 lanes
    if (yb != nullptr) _mm256_storeu_ps(yb + t * y_stride, _mm512_extractf32x8_ps(acc[t], 1));
  }
}

// A tile of two groups: group a's results go to ya, b's to yb (y[t * y_stride + i] for its
// rows i), for n_tokens tokens from x. A group alone is passed as b == a with yb == nullptr:
// the high half repeats the low half's work and is not stored.
using PairFn = void (*)(const uint8_t* a, const uint8_t* b, int64_t n_blocks, const uint8_t* x,
                        int64_t x_stride, float* ya, float* yb, int64_t y_stride);

// Runs tiles[nt - 1] over every group of an interleaved product, two groups per tile. With one
// token tile (decode) group g goes with group g + n_groups / 2, two sequential streams half the
// range apart as in legacy_x8_avx2.cc; with more, neighbouring groups pair up and the pairs walk
// ForEachGroupTile's L2 blocks. Which groups share a tile changes no group's arithmetic. (The
// legacy types' one-token products take four streams instead: ForEachGroupQuad, below.)
template <int T>
inline void ForEachGroupPair(const PairFn (&tiles)[T], const RowSource& groups, int64_t n_groups,
                             int64_t n_blocks, const uint8_t* x, int64_t x_stride, int64_t n_tokens,
                             float* y, int64_t y_stride) {
  const int64_t gb = groups.row_bytes;
  auto group = [&](int64_t g) { return groups.base + g * gb; };
  auto out = [&](int64_t g, int64_t t0) { return y + t0 * y_stride + g * kGroupRows; };
  if (n_tokens <= T) {
    const int nt = static_cast<int>(n_tokens);
    const int64_t half = n_groups / 2;
    for (int64_t g = 0; g < half; ++g) {
      tiles[nt - 1](group(g), group(g + half), n_blocks, x, x_stride, out(g, 0), out(g + half, 0),
                    y_stride);
    }
    if (n_groups % 2 != 0) {
      const int64_t g = n_groups - 1;
      tiles[nt - 1](group(g), group(g), n_blocks, x, x_stride, out(g, 0), nullptr, y_stride);
    }
    return;
  }
  const RowSource pairs{groups.base, 2 * gb, nullptr};
  ForEachGroupTile<T>(pairs, n_groups / 2, n_tokens, [&](int64_t p, int64_t t0, int nt) {
    tiles[nt - 1](group(2 * p), group(2 * p + 1), n_blocks, x + t0 * x_stride, x_stride,
                  out(2 * p, t0), out(2 * p + 1, t0), y_stride);
  });
  if (n_groups % 2 != 0) {
    const int64_t g = n_groups - 1;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, n_tokens - t0));
      tiles[nt - 1](group(g), group(g), n_blocks, x + t0 * x_stride, x_stride, out(g, t0), nullptr,
                    y_stride);
    }
  }
}

// A tile of four groups and one token: pairs (g[0], g[1]) and (g[2], g[3]) walked block by
// block in turn, group i's results to y[i].
using QuadFn = void (*)(const uint8_t* const (&g)[4], int64_t n_blocks, const uint8_t* x,
                        float* const (&y)[4]);

// ForEachGroupPair's one-token case in four streams instead of two: with q = n_groups / 4,
// groups g, g + q, g + 2q and g + 3q go through quad together, and the n_groups % 4 left over
// through tiles[0] as ForEachGroupPair pairs them. Measured on AMD Zen 5 (2026-12-06,
// docs/performance.md, "On AMD Zen 5"; Zen 4 had read the other way): the Q4_0 decode 1.12-1.16x
// at one thread and 1.09-1.11x at two against two streams, the two alternated every four
// tokens in one process. Which groups share a tile changes no group's arithmetic.
template <int T>
inline void ForEachGroupQuad(QuadFn quad, const PairFn (&tiles)[T], const RowSource& groups,
                             int64_t n_groups, int64_t n_blocks, const uint8_t* x, float* y) {
  const int64_t gb = groups.row_bytes;
  const int64_t q = n_groups / 4;
  for (int64_t g = 0; g < q; ++g) {
    const uint8_t* const gs[4] = {groups.base + g * gb, groups.base + (g + q) * gb,
                                  groups.base + (g + 2 * q) * gb, groups.base + (g + 3 * q) * gb};
    float* const ys[4] = {y + g * kGroupRows, y + (g + q) * kGroupRows,
                          y + (g + 2 * q) * kGroupRows, y + (g + 3 * q) * kGroupRows};
    quad(gs, n_blocks, x, ys);
  }
  const int64_t done = 4 * q;
  if (done < n_groups) {
    const RowSource rest{groups.base + done * gb, gb, nullptr};
    ForEachGroupPair(tiles, rest, n_groups - done, n_blocks, x, 0, 1, y + done * kGroupRows, 0);
  }
}

}  // namespace thermocline::matmul_internal::avx512
