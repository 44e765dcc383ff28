// The portable dot product for Q3_K in the 8-row interleaved layout (shared/gguf/q3_kx8.h); its
// activations are plain Q8_K, prepared as Q6_K's (PrepareQ6_Kx8). The AVX2 and AVX-512 kernels
// are q3_kx8_avx2.cc and q3_kx8_avx512.cc. All compute, per row and super-block, the exact
// integer I = sum_s sc_s * sum_{l in s} (q_l - 4) xq_l (q_l the 3-bit quant, 0..7; |I| <= 16 x
// 32 x 16 x 7 x 127 < 2^24) and add it as acc = fma(fl(d * xd), fl(I), acc): the same operations
// in the same order, hence the same bits.
#include "shared/gguf/q3_kx8.h"

#include <cstdint>
#include <cstring>

#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/kernels/superblock_sums_portable.h"

namespace thermocline::matmul_internal {
namespace {

int Q3_Kx8Scale(const uint8_t* words, int s) {
  // words: the row's 12 packed bytes. Sub-block s: low nibble of byte s (s < 8) or high nibble
  // of byte s - 8, two high bits at bit 2 (s / 4) of byte 8 + s % 4; stored + 32.
  const int low = s < 8 ? words[s] & 0x0F : words[s - 8] >> 4;
  const int high = (words[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace

void DotQ3_Kx8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                       int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  static_assert(kQ3_Kx8DAt == 0 && kQ3_Kx8Rows == 8);
  DotSuperBlockSumsPortable<kQ3_Kx8BlockBytes>(
      groups, n_groups, cols, x, x_stride, n_tokens, y, y_stride,
      [](const uint8_t* wb, int64_t r, const int8_t* xq) {
        uint8_t words[12];
        for (int k = 0; k < 3; ++k) {
          std::memcpy(words + 4 * k, wb + kQ3_Kx8ScalesAt + 32 * k + 4 * r, 4);
        }
        int32_t isum = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t p = 0;
          for (int e = 16 * s; e < 16 * s + 16; ++e) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            const int qs_byte = 32 * h + l;
            const uint8_t qs = wb[kQ3_Kx8QsAt + 32 * (qs_byte / 4) + 4 * r + qs_byte % 4];
            const uint8_t hm = wb[kQ3_Kx8HmaskAt + 32 * (l / 4) + 4 * r + l % 4];
            const int q = ((qs >> (2 * j)) & 3) | (((hm >> (4 * h + j)) & 1) << 2);
            p += (q - 4) * xq[e];
          }
          isum += Q3_Kx8Scale(words, s) * p;
        }
        return isum;
      });
}

}  // namespace thermocline::matmul_internal
