// The column walk of the SIMD float kernels (matmul_avx2.cc, matmul_avx512.cc), with the next
// tile's prefetch; the tile drivers themselves are matmul_kernels.h's (RunRowTiles and
// friends). Included only by those files; every instantiation depends on a step of the
// including file, so files compiled with different ISA flags share no instantiation.
#pragma once

#include <cstdint>

#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/prefetch_weights.h"

namespace thermocline::matmul_internal {

// Calls step(c) for c = 0, kStep, 2 kStep, ... while c + kStep <= cols and returns the first
// column left over. With `next` set it also prefetches the next tile's R rows (kBytes per
// column), one PrefetchWeights per cache line of each row; the steps themselves are unchanged,
// so prefetching never alters the arithmetic.
template <int kBytes, int kStep, int R, typename Step>
int64_t StepColumns(const uint8_t* const* next, int64_t cols, Step&& step) {
  int64_t c = 0;
  if (next != nullptr) {
    constexpr int64_t kLineCols = 64 / kBytes;
    for (; c + kLineCols <= cols; c += kLineCols) {
      for (int r = 0; r < R; ++r) {
        PrefetchWeights(next[r] + c * kBytes);
      }
      for (int64_t k = 0; k < kLineCols; k += kStep) step(c + k);
    }
  }
  for (; c + kStep <= cols; c += kStep) step(c);
  return c;
}

}  // namespace thermocline::matmul_internal
