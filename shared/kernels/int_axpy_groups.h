// The groups of IntAxpyRows (matmul_kernels.h) as its SIMD kernels walk them: a group's row
// pointers, and the next group's rows fetched into L1 while this group computes, chunk by chunk
// (without that, each group's prepass starts with sixteen misses to DRAM).
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>

#include "shared/kernels/matmul_kernels.h"

namespace thermocline::matmul_internal {

struct IntAxpyGroup {
  static constexpr int kRows = static_cast<int>(kIntAxpyGroupRows);
  int n = 0;                // rows in this group
  const uint8_t* r[kRows];  // rows past n repeat the group's first row (their q is 0)
  int n_next = 0;
  const uint8_t* next[kRows];
  int64_t fetched = 0;  // bytes of each next row prefetched so far

  IntAxpyGroup(const RowSource& rows, int64_t g0, int64_t n_rows) {
    n = static_cast<int>(std::min(kIntAxpyGroupRows, n_rows - g0));
    for (int i = 0; i < kRows; ++i) r[i] = rows.row(g0 + (i < n ? i : 0));
    n_next = static_cast<int>(std::clamp<int64_t>(n_rows - g0 - kRows, 0, kRows));
    for (int i = 0; i < n_next; ++i) next[i] = rows.row(g0 + kRows + i);
  }

  // Prefetches the next group's rows up to byte `end` of each (a chunk's end), and their last
  // byte once `end` is the row's end (`row_bytes`).
  void FetchNext(int64_t end, int64_t row_bytes) {
    for (; fetched < end; fetched += 64) {
      for (int i = 0; i < n_next; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(next[i] + fetched), _MM_HINT_T0);
      }
    }
    if (end == row_bytes) {
      for (int i = 0; i < n_next; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(next[i] + end - 1), _MM_HINT_T0);
      }
    }
  }
};

}  // namespace thermocline::matmul_internal
