// The portable dot product for IQ4_XS in the 8-row interleaved layout (shared/gguf/iq4_xsx8.h);
// its activations are plain Q8_K, prepared as Q6_K's (PrepareQ6_Kx8). The AVX2 and AVX-512
// kernels are iq4_xsx8_avx2.cc and iq4_xsx8_avx512.cc. All compute, per row and super-block, the
// exact integer I = sum_s sc_s * sum_{l in s} value(q_l) xq_l (|I| <= 8 x 32 x 32 x 127 x 127 <
// 2^27) and add it as acc = fma(fl(d * xd), fl(I), acc): the same operations in the same order,
// hence the same bits.
#include "shared/gguf/iq4_xsx8.h"

#include <cstdint>
#include <cstring>

#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/superblock_sums_portable.h"

namespace thermocline::matmul_internal {

void DotIq4_XSx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                         int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  static_assert(kIq4_XSx8DAt == 0 && kIq4_XSx8Rows == 8);
  DotSuperBlockSumsPortable<kIq4_XSx8BlockBytes>(
      groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride,
      [](const uint8_t* wb, int64_t r, const int8_t* xq) {
        uint16_t scales_h;
        uint32_t scales_l;
        std::memcpy(&scales_h, wb + kIq4_XSx8ScalesHAt + 2 * r, 2);
        std::memcpy(&scales_l, wb + kIq4_XSx8ScalesLAt + 4 * r, 4);
        int32_t isum = 0;
        for (int s = 0; s < 8; ++s) {
          const int sc =
              static_cast<int>(((scales_l >> (4 * s)) & 0xF) | (((scales_h >> (2 * s)) & 3) << 4)) -
              32;
          int32_t p = 0;
          for (int i = 0; i < 16; ++i) {
            const int j = 16 * s + i;  // qs byte: chunk j / 4, byte j % 4 of row r's lane
            const uint8_t q = wb[kIq4_XSx8QsAt + 32 * (j / 4) + 4 * r + j % 4];
            p += kIq4nlValues[q & 0x0F] * xq[32 * s + i];
            p += kIq4nlValues[q >> 4] * xq[32 * s + 16 + i];
          }
          isum += sc * p;
        }
        return isum;
      });
}

}  // namespace thermocline::matmul_internal
