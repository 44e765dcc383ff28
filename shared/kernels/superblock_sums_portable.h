// The portable dot product of the 8-row interleaved layouts whose rows each form one exact int32
// I per super-block (Q3_K, Q6_K, IQ4_XS: q3_kx8.cc, q6_kx8.cc, iq4_xsx8.cc) against plain Q8_K
// activations. The layout gives only its I; the walk over groups, tokens and super-blocks and the
// f32 step acc = fma(fl(d * xd), fl(I), acc), super-blocks in order, are this one, which is what
// the AVX2 and AVX-512 kernels' AddSuperBlock does lane by lane: every family's bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "shared/gguf/ggml_type.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {

// row_sum(wb, r, xq): row r's I for the group's super-block at wb against the token's 256 Q8_K
// quants xq. Each super-block of a group starts with its 8 rows' fp16 d.
template <int64_t kBlockBytes, class RowSum>
void DotSuperBlockSumsPortable(const RowSource& groups, int64_t n_groups, int64_t cols,
                               const uint8_t* x, int64_t x_stride, int64_t n_tokens, float* y,
                               int64_t y_stride, RowSum&& row_sum) {
  constexpr int64_t kRows = 8;
  const int64_t n_blocks = cols / kQK_K;
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* group = groups.base + g * groups.row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const uint8_t* xt = x + t * x_stride;
      float acc[kRows] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* wb = group + b * kBlockBytes;
        const uint8_t* xb = xt + b * kQ8KBlockBytes;  // block_q8_K: f32 d, int8 qs[256], ...
        float xd;
        std::memcpy(&xd, xb, 4);
        const int8_t* xq = reinterpret_cast<const int8_t*>(xb + 4);
        for (int64_t r = 0; r < kRows; ++r) {
          const int32_t isum = row_sum(wb, r, xq);
          uint16_t dh;
          std::memcpy(&dh, wb + 2 * r, 2);
          acc[r] = std::fma(Fp16ToFp32(dh) * xd, static_cast<float>(isum), acc[r]);
        }
      }
      std::memcpy(y + t * y_stride + g * kRows, acc, sizeof acc);
    }
  }
}

}  // namespace thermocline::matmul_internal
