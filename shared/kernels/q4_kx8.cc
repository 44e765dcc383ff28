// Activation preparation and the portable dot product for Q4_K and Q5_K in the 8-row interleaved
// layouts (shared/gguf/q4_kx8.h); the AVX2 kernel is q4_kx8_avx2.cc. Both compute, per row and
// super-block, the exact integer sums I = sum_s sc_s * sum_{l in s} q_l xq_l and
// M = sum_s mn_s * xsum_s, and add them as acc = fma(fl(d * xd), fl(I), acc), then
// acc = fma(-fl(dmin * xd), fl(M), acc): the same operations in the same order, hence the same
// bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shared/gguf/q4_kx8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {

int64_t Q4_Kx8InputBytes(int64_t cols) { return cols / kQK_K * kQ4_Kx8InputBlockBytes; }

void PackQ4_Kx8Input(const uint8_t* q8k, int64_t n_blocks, uint8_t* out) {
  // block_q8_K: f32 d at 0, int8 qs[256] at 4, int16 bsums[16] at 260.
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* src = q8k + b * kQ8KBlockBytes;
    uint8_t* blk = out + b * kQ4_Kx8InputBlockBytes;
    std::memcpy(blk, src + 4, kQK_K);
    std::memcpy(blk + kQ4_Kx8InputDAt, src, 4);
    int16_t bsums[16];
    std::memcpy(bsums, src + 4 + kQK_K, sizeof bsums);
    int16_t sums[8];
    for (int s = 0; s < 8; ++s) sums[s] = static_cast<int16_t>(bsums[2 * s] + bsums[2 * s + 1]);
    std::memcpy(blk + kQ4_Kx8InputSumsAt, sums, sizeof sums);
    std::memset(blk + kQ4_Kx8InputSumsAt + sizeof sums, 0,
                kQ4_Kx8InputBlockBytes - kQ4_Kx8InputSumsAt - sizeof sums);
  }
}

void PrepareQ4_Kx8(const float* x, int64_t cols, uint8_t* out) {
  thread_local std::vector<uint8_t> q;
  q.resize(cols / kQK_K * kQ8KBlockBytes);
  QuantizeRowQ8_K(x, q.data(), cols);
  PackQ4_Kx8Input(q.data(), cols / kQK_K, out);
}

namespace {

// kHigh: Q5_K, whose quants take bit s of their qh byte as bit 4 (s the sub-block).
template <bool kHigh>
void Dot(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
         int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  constexpr int64_t kBlock = kHigh ? kQ5_Kx8BlockBytes : kQ4_Kx8BlockBytes;
  constexpr int64_t kQs = kHigh ? kQ5_Kx8QsAt : kQ4_Kx8QsAt;
  const int64_t n_blocks = cols / kQK_K;
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* group = groups.base + g * groups.row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const uint8_t* xt = x + t * x_stride;
      float acc[kQ4_Kx8Rows] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* wb = group + b * kBlock;
        const uint8_t* xb = xt + b * kQ4_Kx8InputBlockBytes;
        const int8_t* xq = reinterpret_cast<const int8_t*>(xb);
        float xd;
        std::memcpy(&xd, xb + kQ4_Kx8InputDAt, 4);
        int16_t xsum[8];
        std::memcpy(xsum, xb + kQ4_Kx8InputSumsAt, sizeof xsum);
        for (int64_t r = 0; r < kQ4_Kx8Rows; ++r) {
          int32_t isum = 0, msum = 0;
          for (int s = 0; s < 8; ++s) {
            const int g64 = s / 2, high = s % 2;
            int32_t p = 0;
            for (int k = 0; k < 8; ++k) {
              const uint8_t* q = wb + kQs + 32 * (8 * g64 + k) + 4 * r;
              const uint8_t* qh = wb + kQ5_Kx8QhAt + 32 * k + 4 * r;
              for (int i = 0; i < 4; ++i) {
                int v = high ? q[i] >> 4 : q[i] & 0x0F;
                if constexpr (kHigh) v |= ((qh[i] >> s) & 1) << 4;
                p += v * xq[64 * g64 + 32 * high + 4 * k + i];
              }
            }
            const int64_t at = 16 * (s / 2) + 2 * r + s % 2;
            isum += wb[kQ4_Kx8ScalesAt + at] * p;
            msum += wb[kQ4_Kx8MinsAt + at] * xsum[s];
          }
          uint16_t dh, mh;
          std::memcpy(&dh, wb + kQ4_Kx8DAt + 2 * r, 2);
          std::memcpy(&mh, wb + kQ4_Kx8DminAt + 2 * r, 2);
          acc[r] = std::fma(Fp16ToFp32(dh) * xd, static_cast<float>(isum), acc[r]);
          acc[r] = std::fma(-(Fp16ToFp32(mh) * xd), static_cast<float>(msum), acc[r]);
        }
      }
      std::memcpy(y + t * y_stride + g * kQ4_Kx8Rows, acc, sizeof acc);
    }
  }
}

}  // namespace

void DotQ4_Kx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  Dot<false>(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
}

void DotQ5_Kx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  Dot<true>(groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride);
}

}  // namespace thermocline::matmul_internal
