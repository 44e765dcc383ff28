// The portable dot product for Q6_K in the 8-row interleaved layout (shared/gguf/q6_kx8.h) and
// its activation preparation (plain Q8_K); the AVX2 kernel is q6_kx8_avx2.cc. Both compute, per
// row and super-block, the exact integer I = sum_s sc_s * sum_{l in s} (q_l - 32) xq_l and add
// it as acc = fma(fl(d * xd), fl(I), acc): the same operations in the same order, hence the
// same bits.
#include "shared/gguf/q6_kx8.h"

#include <cstdint>

#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/superblock_sums_portable.h"

namespace thermocline::matmul_internal {

int64_t Q6_Kx8InputBytes(int64_t cols) { return cols / kQK_K * kQ8KBlockBytes; }

void PrepareQ6_Kx8(const float* x, int64_t cols, uint8_t* out) { QuantizeRowQ8_K(x, out, cols); }

void DotQ6_Kx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  static_assert(kQ6_Kx8DAt == 0 && kQ6_Kx8Rows == 8);
  DotSuperBlockSumsPortable<kQ6_Kx8BlockBytes>(
      groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride,
      [](const uint8_t* wb, int64_t r, const int8_t* xq) {
        int32_t isum = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t p = 0;
          for (int e = 16 * s; e < 16 * s + 16; ++e) {
            const int h = e / 128, ep = e % 128;
            const int ql_byte = 64 * h + ep % 64, qh_byte = 32 * h + ep % 32;
            const uint8_t ql = wb[kQ6_Kx8QlAt + 32 * (ql_byte / 4) + 4 * r + ql_byte % 4];
            const uint8_t qh = wb[kQ6_Kx8QhAt + 32 * (qh_byte / 4) + 4 * r + qh_byte % 4];
            const int low = ep / 64 ? ql >> 4 : ql & 0x0F;
            const int high = (qh >> (2 * (ep / 32))) & 3;
            p += ((low | (high << 4)) - 32) * xq[e];
          }
          const uint8_t sc = wb[kQ6_Kx8ScalesAt + 16 * (s / 2) + 2 * r + s % 2];
          isum += static_cast<int8_t>(sc) * p;
        }
        return isum;
      });
}

}  // namespace thermocline::matmul_internal
