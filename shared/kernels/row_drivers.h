// Drivers of the SIMD row kernels (matmul_avx2.cc, matmul_avx512.cc): they walk a product's
// tiles with ForEachTile and call a kernel type's Tile / AxpyTile, whatever its ISA. Included
// only by those files; every instantiation depends on a kernel type of the including file (in
// its anonymous namespace), so files compiled with different ISA flags share no instantiation.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {

// One tile of a kernel type K: K::Tile<R, T>. rows: the tile's weight rows; next: rows to
// prefetch meanwhile, or nullptr (see ForEachTile).
using TileFn = void (*)(const uint8_t* const* rows, const uint8_t* const* next, int64_t cols,
                        const uint8_t* x, int64_t x_stride, float* y, int64_t y_stride);

// Calls step(c) for c = 0, kStep, 2 kStep, ... while c + kStep <= cols and returns the first
// column left over. With `next` set it also prefetches the next tile's R rows (kBytes per
// column) to L2, one prefetch per cache line of each row (a tile ahead can be more than L1
// holds); the steps themselves are unchanged, so prefetching never alters the arithmetic.
template <int kBytes, int kStep, int R, typename Step>
int64_t StepColumns(const uint8_t* const* next, int64_t cols, Step&& step) {
  int64_t c = 0;
  if (next != nullptr) {
    constexpr int64_t kLineCols = 64 / kBytes;
    for (; c + kLineCols <= cols; c += kLineCols) {
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(next[r] + c * kBytes), _MM_HINT_T1);
      }
      for (int64_t k = 0; k < kLineCols; k += kStep) step(c + k);
    }
  }
  for (; c + kStep <= cols; c += kStep) step(c);
  return c;
}

template <class K, int kMaxR, int kMaxT, size_t... I>
constexpr std::array<TileFn, sizeof...(I)> MakeTileTable(std::index_sequence<I...>) {
  return {&K::template Tile<static_cast<int>(I) / kMaxT + 1, static_cast<int>(I) % kMaxT + 1>...};
}

template <class K, int kMaxR, int kMaxT>
void RunTiles(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
              int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  static constexpr auto kTable =
      MakeTileTable<K, kMaxR, kMaxT>(std::make_index_sequence<kMaxR * kMaxT>());
  ForEachTile<kMaxR, kMaxT>(rows, n_rows, n_tokens, y, y_stride,
                            [&](const uint8_t* const* w, const uint8_t* const* next, int nr, int nt,
                                int64_t t0, float* yt, int64_t yt_stride) {
                              kTable[(nr - 1) * kMaxT + (nt - 1)](w, next, cols, x + t0 * x_stride,
                                                                  x_stride, yt, yt_stride);
                            });
}

// TypeKernels::dot over K's tile shapes: K::kGemvRows rows for one token, K::kRows x K::kTokens
// for more.
template <class K>
void DotRows(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
             int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  if (n_tokens == 1) {
    RunTiles<K, K::kGemvRows, 1>(rows, n_rows, cols, x, x_stride, 1, y, y_stride);
  } else {
    RunTiles<K, K::kRows, K::kTokens>(rows, n_rows, cols, x, x_stride, n_tokens, y, y_stride);
  }
}

// TypeKernels::axpy over K::AxpyTile<R>.
template <class K>
void AxpyRows(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols, float* y) {
  // Four rows per pass over y keep y's loads and stores to a quarter of the FMAs; the next four
  // rows (scattered, for the sparse FFN) are prefetched meanwhile. Each element still takes the
  // rows one by one in order, so the grouping never changes a result.
  constexpr int kR = 4;
  int64_t i = 0;
  for (; i + kR <= n_rows; i += kR) {
    const uint8_t* w[kR];
    const uint8_t* next[kR];
    for (int k = 0; k < kR; ++k) {
      w[k] = rows.row(i + k);
      next[k] = rows.row(std::min(i + kR + k, n_rows - 1));
    }
    K::template AxpyTile<kR>(w, i + kR < n_rows ? next : nullptr, coeffs + i, cols, y);
  }
  for (; i < n_rows; ++i) {
    const uint8_t* w[1] = {rows.row(i)};
    K::template AxpyTile<1>(w, nullptr, coeffs + i, cols, y);
  }
}

}  // namespace thermocline::matmul_internal
