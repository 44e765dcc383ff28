// Activation preparation and the portable dot product for Q4_0 in the 8-row interleaved layout
// (shared/gguf/q4_0x8.h); the AVX2 kernel is q4_0x8_avx2.cc. Both compute, per row and block,
// the exact integer sum of (nibble - 8) * q_x and add it as acc = fma(fl(d_w * d_x), sum, acc):
// the same operations in the same order, hence the same bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shared/gguf/q4_0x8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {

int64_t Q4_0x8InputBytes(int64_t cols) { return cols / kQK * kQ4_0x8InputBlockBytes; }

void PackQ4_0x8Input(const BlockQ8_0* q, int64_t n_blocks, uint8_t* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* blk = out + b * kQ4_0x8InputBlockBytes;
    const float d = Fp16ToFp32(q[b].d);
    int32_t sum = 0;
    for (int8_t v : q[b].qs) sum += v;
    const int32_t bias = -8 * sum;
    std::memcpy(blk, &d, 4);
    std::memcpy(blk + 4, &bias, 4);
    std::memcpy(blk + 8, q[b].qs, kQK);
  }
}

void PrepareQ4_0x8(const float* x, int64_t cols, uint8_t* out) {
  // ggml's reference rounding (QuantizeRow), then per block [f32 d][int32 bias][32 x int8].
  thread_local std::vector<BlockQ8_0> q;
  q.resize(cols / kQK);
  QuantizeRow(GgmlType::kQ8_0, x, q.data(), cols);
  PackQ4_0x8Input(q.data(), cols / kQK, out);
}

void DotQ4_0x8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t n_blocks = cols / kQK;
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* group = groups.base + g * groups.row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const uint8_t* xt = x + t * x_stride;
      float acc[kQ4_0x8Rows] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* wb = group + b * kQ4_0x8BlockBytes;
        const uint8_t* xb = xt + b * kQ4_0x8InputBlockBytes;
        float xd;
        int32_t bias;
        std::memcpy(&xd, xb, 4);
        std::memcpy(&bias, xb + 4, 4);
        const int8_t* xq = reinterpret_cast<const int8_t*>(xb + 8);
        for (int64_t r = 0; r < kQ4_0x8Rows; ++r) {
          uint16_t dh;
          std::memcpy(&dh, wb + 2 * r, 2);
          int32_t sum = bias;
          for (int64_t k = 0; k < 4; ++k) {
            const uint8_t* q = wb + kQ4_0x8ScaleBytes + 32 * k + 4 * r;
            for (int64_t j = 0; j < 4; ++j) {
              sum += (q[j] & 0x0F) * xq[4 * k + j] + (q[j] >> 4) * xq[16 + 4 * k + j];
            }
          }
          acc[r] = std::fma(Fp16ToFp32(dh) * xd, static_cast<float>(sum), acc[r]);
        }
      }
      std::memcpy(y + t * y_stride + g * kQ4_0x8Rows, acc, sizeof acc);
    }
  }
}

}  // namespace thermocline::matmul_internal
