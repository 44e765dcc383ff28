// What the AMX kernels of the interleaved layouts (q4_0x8_amx.cc, q4_kx8_amx.cc) share: the tile
// configuration, and the walk that gives AMX every pair of groups by 16 tokens and the rest to
// the AVX-512 kernel whose bits the AMX one reproduces. Include only from *_amx.cc files.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "shared/kernels/interleaved8_avx512.h"
#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal::amx {

inline constexpr int kTileTokens = 16;
using avx512::kGroupRows;
inline constexpr int kPairRows = 2 * kGroupRows;  // two groups: a B operand's 16 columns
inline constexpr int64_t kBBytes = 8 * 64;  // a 32-column block's B operand: 8 rows of 64 bytes

// Tiles 0 and 3: activations (16 tokens x 32 bytes); 1 and 4: weights (8 x 64 bytes: 32
// columns of 16 rows, 4 per dword); 2 and 5: sums (16 tokens x 16 int32). Two blocks in flight,
// each in its own three tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {32, 64, 64, 32, 64, 64};
  uint8_t rows[16] = {kTileTokens, 8, kTileTokens, kTileTokens, 8, kTileTokens};
};

using DotFn = decltype(TypeKernels::dot);

// An interleaved product through AMX: for each pair of neighbouring groups a, b,
// unpack(a, b, buf) writes the pair's B operands (unpacked_bytes), and
// tokens(a, b, buf, x_t, ya, yb) computes 16 tokens from x_t into ya (group a) and yb (group b),
// at y[t * y_stride + i]. The tokens past the last 16 and an odd last group go to `fallback`,
// and so does all of a product with fewer than 16 tokens or one group.
template <class Unpack, class Tokens>
void RunPairs(DotFn fallback, const RowSource& groups, int64_t n_groups, int64_t cols,
              const uint8_t* x, int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride,
              int64_t unpacked_bytes, Unpack&& unpack, Tokens&& tokens) {
  const int64_t amx_tokens = n_tokens / kTileTokens * kTileTokens;
  const int64_t pairs = n_groups / 2;
  if (amx_tokens == 0 || pairs == 0) {
    fallback(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
    return;
  }
  const int64_t gb = groups.row_bytes;
  static const TileConfig kConfig;
  _tile_loadconfig(&kConfig);
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  thread_local std::vector<Line> buffer;
  buffer.resize(static_cast<size_t>((unpacked_bytes + 63) / 64));
  uint8_t* buf = buffer.data()->bytes;
  for (int64_t p = 0; p < pairs; ++p) {
    const uint8_t* a = groups.base + 2 * p * gb;
    const uint8_t* b = a + gb;
    unpack(a, b, buf);
    for (int64_t t0 = 0; t0 < amx_tokens; t0 += kTileTokens) {
      float* out = y + t0 * y_stride + 2 * p * kGroupRows;
      tokens(a, b, buf, x + t0 * x_stride, out, out + kGroupRows);
    }
  }
  // Tiles off before other code runs on this thread (a context switch then saves less).
  _tile_release();
  if (amx_tokens < n_tokens) {
    fallback(RowSource{groups.base, gb, nullptr}, 2 * pairs, cols, x + amx_tokens * x_stride,
             x_stride, n_tokens - amx_tokens, y + amx_tokens * y_stride, y_stride);
  }
  if (n_groups % 2 != 0) {
    fallback(RowSource{groups.base + (n_groups - 1) * gb, gb, nullptr}, 1, cols, x, x_stride,
             n_tokens, y + (n_groups - 1) * kGroupRows, y_stride);
  }
}

}  // namespace thermocline::matmul_internal::amx
