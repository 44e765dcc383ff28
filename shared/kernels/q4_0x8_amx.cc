// AMX (Advanced Matrix Extensions) product of Q4_0 weights in the 8-row interleaved layout
// (shared/gguf/q4_0x8.h) with 16 or more tokens: the prompt's GEMM on CPUs with AMX-INT8 and an
// OS that grants this process the tile state (AmxInt8Usable). Compiled with the AVX-512 and AMX
// flags of *_amx.cc; fewer tokens, the tokens past the last 16 and an odd last group go to
// DotLegacyX8Avx512<kQ4_0>.
//
// Why. The VNNI kernel (legacy_x8_avx512.cc) spends per block, token and 16 rows 8 vpdpbusd, 8
// broadcasts, a conversion, a multiply and an FMA: it reaches ~190 GFLOP/s on one core. One
// TDPBSSD multiplies a whole 16-token x 32-column block of activations by the 32 x 16 block of
// two groups' weights into 16 x 16 exact int32 sums, so per block and 16 rows the vector units
// only turn each token's 16 sums into f32 and add them in: a conversion, a multiply and an FMA
// per token, against ~19 operations. Expected before measuring: the Q4_0 GEMM 2-3x (the f32
// epilogue bounds it), a 64-token Q4_0 prompt ~1.5x. Measured (one core, in L2, 64 rows x 4096
// columns x 64 tokens, the two kernels timed in turn in one process): 1.63-1.72x, ~290 -> ~480
// GFLOP/s. Without the f32 epilogue the tiles alone reach ~700: with a 32-column block each
// TDPBSSD uses half the tile unit's depth, and the per-block tile loads and store dominate.
//
// Arithmetic. Per row and block the tile's sum is sum (q - 8) * q_x, the same exact int32 as the
// VNNI kernel's bias + sum q * q_x, and every (row, token) adds it as acc = fma(fl(d_w * d_x),
// sum, acc) over the blocks in order: DotLegacyX8Avx512's bits, hence the avx2 family's.
//
// Layout. The weights are the tile's B operand, which holds in each 64-byte row, for 16 columns
// (weight rows) n, 4 consecutive k: B[kk][4n + i] = W[n][4 kk + i]. q4_0x8 stores byte 4r + j of
// chunk c (32 bytes after the scales) with element 4c + j of row r in its low nibble and element
// 16 + 4c + j in its high one, so B's row c (c < 4) is chunk c's low nibbles of two groups side
// by side, and row 4 + c their high nibbles: an and, a shift and a subtract per chunk. The
// activations are the A operand as PrepareLegacyX8Avx2 wrote them: token t's 32 quants of block b
// at x + t * x_stride + 40 b + 8, one tile row per token.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "shared/gguf/q4_0x8.h"
#include "shared/kernels/amx_pairs.h"
#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {
namespace {

using amx::kBBytes;
using amx::kPairRows;
using amx::kTileTokens;

// Block b of groups a and b as B operands, for every block of the pair.
void UnpackPair(const uint8_t* a, const uint8_t* b, int64_t n_blocks, uint8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  for (int64_t k = 0; k < n_blocks; ++k) {
    const uint8_t* wa = a + k * kQ4_0x8BlockBytes;
    const uint8_t* wb = b + k * kQ4_0x8BlockBytes;
    uint8_t* o = out + k * kBBytes;
    for (int c = 0; c < 4; ++c) {
      const int64_t at = kQ4_0x8ScaleBytes + 32 * c;
      const __m512i v = avx512::Load2x32(wa + at, wb + at);
      const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(v, low), eight);
      const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight);
      _mm512_store_si512(o + 64 * c, lo);
      _mm512_store_si512(o + 64 * (4 + c), hi);
    }
  }
}

// Block k's sums (sums[t][i]: token t, row i of the pair) added into acc.
inline void AddBlock(const uint8_t* a, const uint8_t* b, int64_t k, const int32_t (*sums)[kPairRows],
                     const uint8_t* x, int64_t x_stride, __m512* acc) {
  const __m512 wd = avx512::Halves2x8(a + k * kQ4_0x8BlockBytes, b + k * kQ4_0x8BlockBytes);
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
    AddBlock(a, b, k, sums[0], x, x_stride, acc);
    AddBlock(a, b, k + 1, sums[1], x, x_stride, acc);
  }
  if (k < n_blocks) {
    _tile_zero(2);
    _tile_loadd(0, xq + k * kLegacyX8InputBlockBytes, x_stride);
    _tile_loadd(1, unpacked + k * kBBytes, 64);
    _tile_dpbssd(2, 0, 1);
    _tile_stored(2, sums[0], 64);
    AddBlock(a, b, k, sums[0], x, x_stride, acc);
  }
  avx512::StoreTile(acc, ya, yb, y_stride);
}

}  // namespace

void DotQ4_0x8Amx(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                  int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t n_blocks = cols / kQK;
  amx::RunPairs(
      &DotLegacyX8Avx512<GgmlType::kQ4_0>, groups, n_groups, cols, x, x_stride, n_tokens, y,
      y_stride, n_blocks * kBBytes,
      [&](const uint8_t* a, const uint8_t* b, uint8_t* buf) { UnpackPair(a, b, n_blocks, buf); },
      [&](const uint8_t* a, const uint8_t* b, const uint8_t* buf, const uint8_t* xt, float* ya,
          float* yb) { PairTokens(a, b, buf, n_blocks, xt, x_stride, ya, yb, y_stride); });
}

}  // namespace thermocline::matmul_internal
