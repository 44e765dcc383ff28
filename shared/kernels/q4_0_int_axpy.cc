// The portable integer axpy over Q4_0 rows: the operations matmul_kernels.h specifies
// (IntAxpyRows), written out one value at a time. q4_0_int_axpy_avx2.cc performs the same ones
// in SIMD, so the two agree bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "shared/gguf/ggml_type.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {

void IntAxpyQ4_0Portable(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols,
                         float* y) {
  constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);
  constexpr int64_t kQsAt = offsetof(BlockQ4_0, qs);
  const int64_t nb = cols / kQK;
  for (int64_t g0 = 0; g0 < n_rows; g0 += kIntAxpyGroupRows) {
    const int64_t n = std::min(kIntAxpyGroupRows, n_rows - g0);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk[kIntAxpyGroupRows];
      float a[kIntAxpyGroupRows];
      // The maximum over the a_i that are not NaN (matmul_kernels.h), in any order.
      float amax = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        blk[i] = rows.row(g0 + i) + b * kBlockBytes;
        uint16_t d;
        std::memcpy(&d, blk[i], sizeof d);
        a[i] = coeffs[g0 + i] * Fp16ToFp32(d);
        const float m = std::fabs(a[i]);
        amax = m > amax ? m : amax;
      }
      const float s = amax / 127;
      const float id = s >= kIntAxpyMinScale ? 1.0f / s : 0.0f;
      int32_t q[kIntAxpyGroupRows];
      int32_t corr = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float v = a[i] * id;
        q[i] = v == v ? static_cast<int32_t>(std::nearbyint(v)) : 0;
        corr += 8 * q[i];
      }
      float* yb = y + b * kQK;
      for (int64_t j = 0; j < kQK / 2; ++j) {
        int32_t lo = 0, hi = 0;
        for (int64_t i = 0; i < n; ++i) {
          const uint8_t u = blk[i][kQsAt + j];
          lo += q[i] * (u & 0x0F);
          hi += q[i] * (u >> 4);
        }
        yb[j] = std::fma(s, static_cast<float>(lo - corr), yb[j]);
        yb[j + kQK / 2] = std::fma(s, static_cast<float>(hi - corr), yb[j + kQK / 2]);
      }
    }
  }
}

}  // namespace thermocline::matmul_internal
