// AMX product of Q4_K and Q5_K weights in their 8-row interleaved layouts (shared/gguf/q4_kx8.h)
// with 16 or more tokens, where AmxInt8Usable(); the rest goes to DotQ4_Kx8Avx512 /
// DotQ5_Kx8Avx512 (amx_pairs.h).
//
// Why. Per super-block, token and 16 rows the VNNI kernel (q4_kx8_avx512.cc) spends 64 vpdpbusd,
// 64 broadcasts and 8 vpdpwssd on the quants. Here one TDPBSUD per 32-column sub-block forms its
// exact sums for 16 tokens x 16 rows, and the vector units only weight them by the sub-block
// scales (a multiply and an add per token and sub-block) before the VNNI kernel's own mins and
// f32 steps. Expected before measuring: the Q4_K GEMM ~1.5x (the integer weighting, 16
// vpmulld per sub-block, now bounds it). Measured (one core, in L2, 64 rows x 4096 columns x 64
// tokens, both kernels timed in turn in one process): Q4_K 1.29-1.50x (~327 -> ~422 GFLOP/s),
// Q5_K 1.48-1.55x (its VNNI kernel spends more per quant on the fifth bit). A sub-block's
// sum needs 17 bits, so the weighting cannot be vpdpwssd's as in the VNNI kernel.
//
// Arithmetic. A sub-block's sum of q * q_x is the exact int32 the VNNI kernel forms, and so are
// I = sum over sub-blocks of scale * sum and M (the same vpdpwssd of mins and activation sums):
// the lanes then do the VNNI kernel's acc = fma(fl(d * xd), fl(I), acc),
// acc = fma(-fl(dmin * xd), fl(M), acc), super-blocks in order: the avx2 family's bits.
//
// Layout. In q4_kx8 chunk j = 8g + k holds row r's elements 64g + 4k..+3 (sub-block 2g) in the
// low nibbles of its bytes 4r..4r+3 and 64g + 32 + 4k..+3 (sub-block 2g + 1) in the high ones,
// so row k of sub-block 2g's B operand (B[k][4n + i] = W[n][4k + i] for its 32 columns) is
// chunk j's low nibbles of two groups side by side, and of sub-block 2g + 1 their high nibbles:
// the quants are unsigned (TDPBSUD: signed activations, unsigned weights); Q5_K ors in its
// fifth bits first, as the VNNI kernel does. The activations'
// 256 quants lie in order at the start of each 288-byte prepared block.
#include <immintrin.h>

#include <cstdint>

#include "shared/gguf/q4_kx8.h"
#include "shared/kernels/amx_pairs.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using amx::kBBytes;
using amx::kPairRows;
using amx::kTileTokens;

constexpr int kSubBlocks = 8;
constexpr int64_t kUnpackedBlock = kSubBlocks * kBBytes;  // one super-block's 8 B operands

// kHigh: Q5_K, whose fifth bit of chunk j's quants is bit 2g (low nibbles) or 2g + 1 (high) of
// qh chunk j % 8.
template <bool kHigh>
void UnpackPair(const uint8_t* a, const uint8_t* b, int64_t n_blocks, uint8_t* out) {
  constexpr int64_t kBlock = kHigh ? kQ5_Kx8BlockBytes : kQ4_Kx8BlockBytes;
  constexpr int64_t kQs = kHigh ? kQ5_Kx8QsAt : kQ4_Kx8QsAt;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t k = 0; k < n_blocks; ++k) {
    const uint8_t* wa = a + k * kBlock;
    const uint8_t* wb = b + k * kBlock;
    uint8_t* o = out + k * kUnpackedBlock;
    auto group = [&]<int G>() {
      for (int row = 0; row < 8; ++row) {
        const int64_t at = kQs + 32 * (8 * G + row);
        const __m512i v = avx512::Load2x32(wa + at, wb + at);
        __m512i lo = _mm512_and_si512(v, low);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        if constexpr (kHigh) {
          const int64_t qh_at = kQ5_Kx8QhAt + 32 * row;
          const __m512i qh = avx512::Load2x32(wa + qh_at, wb + qh_at);
          lo = _mm512_or_si512(lo, avx512::BitTo4<2 * G>(qh));
          hi = _mm512_or_si512(hi, avx512::BitTo4<2 * G + 1>(qh));
        }
        _mm512_store_si512(o + (2 * G) * kBBytes + 64 * row, lo);
        _mm512_store_si512(o + (2 * G + 1) * kBBytes + 64 * row, hi);
      }
    };
    group.template operator()<0>();
    group.template operator()<1>();
    group.template operator()<2>();
    group.template operator()<3>();
  }
}

// From 16 bytes per group of scale pairs (row r's two at 2r, 2r + 1): lane r of each half as
// int32, the pair's first scale and its second.
struct Scales {
  __m512i first, second;
};
inline Scales WidenScales(const uint8_t* a, const uint8_t* b) {
  const __m512i w = _mm512_cvtepu8_epi16(avx512::Load2x16(a, b));
  return {_mm512_and_si512(w, _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(w, 16)};
}

// 16 tokens from x against the pair's unpacked super-blocks, into ya (group a) and yb (group b).
template <bool kHigh>
void PairTokens(const uint8_t* a, const uint8_t* b, const uint8_t* unpacked, int64_t n_blocks,
                const uint8_t* x, int64_t x_stride, float* ya, float* yb, int64_t y_stride) {
  constexpr int64_t kBlock = kHigh ? kQ5_Kx8BlockBytes : kQ4_Kx8BlockBytes;
  alignas(64) int32_t sums[2][kTileTokens][kPairRows];
  // The integer sums take the registers; the f32 accumulators wait in L1 between super-blocks.
  alignas(64) float acc[kTileTokens][kPairRows] = {};
  for (int64_t k = 0; k < n_blocks; ++k) {
    const uint8_t* wa = a + k * kBlock;
    const uint8_t* wb = b + k * kBlock;
    const uint8_t* xk = x + k * kQ4_Kx8InputBlockBytes;
    const uint8_t* bk = unpacked + k * kUnpackedBlock;
    __m512i isum[kTileTokens];
    for (int t = 0; t < kTileTokens; ++t) isum[t] = _mm512_setzero_si512();
    for (int s = 0; s < kSubBlocks; s += 2) {
      _tile_zero(2);
      _tile_zero(5);
      _tile_loadd(0, xk + 32 * s, x_stride);
      _tile_loadd(1, bk + s * kBBytes, 64);
      _tile_loadd(3, xk + 32 * (s + 1), x_stride);
      _tile_loadd(4, bk + (s + 1) * kBBytes, 64);
      _tile_dpbsud(2, 0, 1);
      _tile_dpbsud(5, 3, 4);
      _tile_stored(2, sums[0], 64);
      _tile_stored(5, sums[1], 64);
      const Scales sc = WidenScales(wa + kQ4_Kx8ScalesAt + 8 * s, wb + kQ4_Kx8ScalesAt + 8 * s);
      for (int t = 0; t < kTileTokens; ++t) {
        isum[t] = _mm512_add_epi32(isum[t],
                                   _mm512_mullo_epi32(sc.first, _mm512_load_si512(sums[0][t])));
        isum[t] = _mm512_add_epi32(isum[t],
                                   _mm512_mullo_epi32(sc.second, _mm512_load_si512(sums[1][t])));
      }
    }
    __m512i mins[4];
    for (int p = 0; p < 4; ++p) {
      const int64_t at = kQ4_Kx8MinsAt + 16 * p;
      mins[p] = _mm512_cvtepu8_epi16(avx512::Load2x16(wa + at, wb + at));
    }
    const __m512 d = avx512::Halves2x8(wa + kQ4_Kx8DAt, wb + kQ4_Kx8DAt);
    const __m512 dmin = avx512::Halves2x8(wa + kQ4_Kx8DminAt, wb + kQ4_Kx8DminAt);
    for (int t = 0; t < kTileTokens; ++t) {
      const uint8_t* xt = xk + t * x_stride;
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {
        msum = _mm512_dpwssd_epi32(msum, mins[p],
                                   avx512::Broadcast4(xt + kQ4_Kx8InputSumsAt + 4 * p));
      }
      const __m512 xd = avx512::BroadcastF32(xt + kQ4_Kx8InputDAt);
      __m512 v = _mm512_load_ps(acc[t]);
      v = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(isum[t]), v);
      v = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(msum), v);
      _mm512_store_ps(acc[t], v);
    }
  }
  __m512 out[kTileTokens];
  for (int t = 0; t < kTileTokens; ++t) out[t] = _mm512_load_ps(acc[t]);
  avx512::StoreTile(out, ya, yb, y_stride);
}

}  // namespace

namespace {

template <bool kHigh>
void Dot(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
         int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t n_blocks = cols / kQK_K;
  amx::RunPairs(
      kHigh ? &DotQ5_Kx8Avx512 : &DotQ4_Kx8Avx512, groups, n_groups, cols, x, x_stride, n_tokens,
      y, y_stride, n_blocks * kUnpackedBlock,
      [&](const uint8_t* a, const uint8_t* b, uint8_t* buf) {
        UnpackPair<kHigh>(a, b, n_blocks, buf);
      },
      [&](const uint8_t* a, const uint8_t* b, const uint8_t* buf, const uint8_t* xt, float* ya,
          float* yb) { PairTokens<kHigh>(a, b, buf, n_blocks, xt, x_stride, ya, yb, y_stride); });
}

}  // namespace

void DotQ4_Kx8Amx(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                  int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  Dot<false>(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
}

void DotQ5_Kx8Amx(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                  int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  Dot<true>(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
