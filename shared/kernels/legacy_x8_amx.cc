// AMX (Advanced Matrix Extensions) product of Q4_0, Q5_0 and Q8_0 weights in their 8-row
// interleaved layouts (shared/gguf/legacy_x8.h) with 16 or more tokens: the prompt's GEMM on CPUs
// with AMX-INT8 and an OS that grants this process the tile state (AmxInt8Usable). Compiled with
// the AVX-512 and AMX flags of *_amx.cc; fewer tokens, the tokens past the last 16 and an odd
// last group go to DotLegacyX8Avx512 (amx_pairs.h).
//
// Why. The VNNI kernel (legacy_x8_avx512.cc) spends per block, token and 16 rows 8 vpdpbusd, 8
// broadcasts, a conversion, a multiply and an FMA: it reaches ~190-300 GFLOP/s on one core. One
// TDPBSSD multiplies a whole 16-token x 32-column block of activations by the 32 x 16 block of
// two groups' weights into 16 x 16 exact int32 sums, so per block and 16 rows the vector units
// only turn each token's 16 sums into f32 and add them in: a conversion, a multiply and an FMA
// per token, against ~19 operations. Expected before measuring: the Q4_0 GEMM 2-3x (the f32
// epilogue bounds it), a 64-token Q4_0 prompt ~1.5x. Measured (one core, in L2, 64 rows x 4096
// columns x 64 tokens, the two kernels timed in turn in one process): Q4_0 1.63-1.72x, ~290 ->
// ~480 GFLOP/s. Without the f32 epilogue the tiles alone reach ~700: with a 32-column block
// each TDPBSSD uses half the tile unit's depth, and the per-block tile loads and store dominate.
//
// Arithmetic. Per row and block the tile's sum is sum q_w * q_x with the signed weight quants
// (Q4_0 q - 8, Q5_0 q - 16, Q8_0 q), the same exact int32 as the VNNI kernel's
// bias + sum (q_w + o) * q_x, and every (row, token) adds it as acc = fma(fl(d_w * d_x), sum,
// acc) over the blocks in order: DotLegacyX8Avx512's bits, hence the avx2 family's.
//
// Layout. The weights are the tile's B operand, which holds in each 64-byte row, for 16 columns
// (weight rows) n, 4 consecutive k: B[kk][4n + i] = W[n][4 kk + i]. A plane of legacy_x8.h holds
// in every 32-bit lane a row's 4 consecutive elements from PlaneElement(p), so B's row kk is the
// plane starting at element 4 kk, of two groups side by side (the VNNI kernel's unpacked planes,
// less the offset o). The activations are the A operand as PrepareLegacyX8Avx2 wrote them: token
// t's 32 quants of block b at x + t * x_stride + 40 b + 8, one tile row per token.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "shared/gguf/legacy_x8.h"
#include "shared/kernels/amx_pairs.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/legacy_x8_planes.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using amx::kBBytes;
using amx::kPairRows;
using amx::kTileTokens;

// Every block of groups a and b as B operands.
template <GgmlType kType>
void UnpackPair(const uint8_t* a, const uint8_t* b, int64_t n_blocks, uint8_t* out) {
  using F = LegacyX8Format<kType>;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(LegacyX8Offset(kType)));
  for (int64_t k = 0; k < n_blocks; ++k) {
    __m512i u[8];
    avx512::UnpackLegacyPlanes<kType>(a + k * F::kBlockBytes, b + k * F::kBlockBytes, u);
    uint8_t* o = out + k * kBBytes;
    for (int p = 0; p < 8; ++p) {
      // q_w + o back to q_w (a wrapping byte subtract: Q8_0's sign-flipped bytes come back
      // exactly), at the B row of the plane's first element.
      _mm512_store_si512(o + 64 * (F::PlaneElement(p) / 4), _mm512_sub_epi8(u[p], offset));
    }
  }
}

// Block k's sums (sums[t][i]: token t, row i of the pair) added into acc.
template <GgmlType kType>
inline void AddBlock(const uint8_t* a, const uint8_t* b, int64_t k,
                     const int32_t (*sums)[kPairRows], const uint8_t* x, int64_t x_stride,
                     __m512* acc) {
  constexpr int64_t kBlockBytes = LegacyX8Format<kType>::kBlockBytes;
  const __m512 wd = avx512::Halves2x8(a + k * kBlockBytes, b + k * kBlockBytes);
  for (int t = 0; t < kTileTokens; ++t) {
    const uint8_t* xb = x + t * x_stride + k * kLegacyX8InputBlockBytes;
    const __m512 scale = _mm512_mul_ps(wd, avx512::BroadcastF32(xb));
    acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_load_si512(sums[t])), acc[t]);
  }
}

// 16 tokens from x against the pair's unpacked blocks: ya (group a) and yb (group b) at
// y[t * y_stride + i]. Two blocks per step, each in its own tiles and sums buffer, so that the
// tile unit's work on one overlaps the vector units' on the other: 1.08-1.10x over one block at
// a time (in L2, one core, 64 rows x 4096 columns x 64 tokens).
template <GgmlType kType>
void PairTokens(const uint8_t* a, const uint8_t* b, const uint8_t* unpacked, int64_t n_blocks,
                const uint8_t* x, int64_t x_stride, float* ya, float* yb, int64_t y_stride) {
  alignas(64) int32_t sums[2][kTileTokens][kPairRows];
  __m512 acc[kTileTokens];
  for (int t = 0; t < kTileTokens; ++t) acc[t] = _mm512_setzero_ps();
  const uint8_t* xq = x + 8;
  int64_t k = 0;
  for (; k + 2 <= n_blocks; k += 2) {
    _tile_zero(2);
    _tile_zero(5);
    _tile_loadd(0, xq + k * kLegacyX8InputBlockBytes, x_stride);
    _tile_loadd(1, unpacked + k * kBBytes, 64);
    _tile_loadd(3, xq + (k + 1) * kLegacyX8InputBlockBytes, x_stride);
    _tile_loadd(4, unpacked + (k + 1) * kBBytes, 64);
    _tile_dpbssd(2, 0, 1);
    _tile_dpbssd(5, 3, 4);
    _tile_stored(2, sums[0], 64);
    _tile_stored(5, sums[1], 64);
    AddBlock<kType>(a, b, k, sums[0], x, x_stride, acc);
    AddBlock<kType>(a, b, k + 1, sums[1], x, x_stride, acc);
  }
  if (k < n_blocks) {
    _tile_zero(2);
    _tile_loadd(0, xq + k * kLegacyX8InputBlockBytes, x_stride);
    _tile_loadd(1, unpacked + k * kBBytes, 64);
    _tile_dpbssd(2, 0, 1);
    _tile_stored(2, sums[0], 64);
    AddBlock<kType>(a, b, k, sums[0], x, x_stride, acc);
  }
  avx512::StoreTile(acc, ya, yb, y_stride);
}

}  // namespace

template <GgmlType kType>
void DotLegacyX8Amx(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                    int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t n_blocks = cols / kQK;
  amx::RunPairs(
      &DotLegacyX8Avx512<kType>, groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride,
      n_blocks * kBBytes,
      [&](const uint8_t* a, const uint8_t* b, uint8_t* buf) {
        UnpackPair<kType>(a, b, n_blocks, buf);
      },
      [&](const uint8_t* a, const uint8_t* b, const uint8_t* buf, const uint8_t* xt, float* ya,
          float* yb) { PairTokens<kType>(a, b, buf, n_blocks, xt, x_stride, ya, yb, y_stride); });
}

template void DotLegacyX8Amx<GgmlType::kQ4_0>(const RowSource&, int64_t, int64_t, const uint8_t*,
                                              int64_t, int64_t, float*, int64_t);
template void DotLegacyX8Amx<GgmlType::kQ5_0>(const RowSource&, int64_t, int64_t, const uint8_t*,
                                              int64_t, int64_t, float*, int64_t);
template void DotLegacyX8Amx<GgmlType::kQ8_0>(const RowSource&, int64_t, int64_t, const uint8_t*,
                                              int64_t, int64_t, float*, int64_t);

}  // namespace thermocline::matmul_internal
