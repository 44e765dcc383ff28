// Activation preparation and the portable dot product for Q4_0, Q5_0 and Q8_0 in their 8-row
// interleaved layouts (shared/gguf/legacy_x8.h); the AVX2 and AVX-512 kernels are
// legacy_x8_avx2.cc and legacy_x8_avx512.cc. All compute, per row and block, the exact integer
// sum bias + sum (q_w + o) * q_x and add it as acc = fma(fl(d_w * d_x), sum, acc): the same
// operations in the same order, hence the same bits.
#include "shared/gguf/legacy_x8.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {
namespace {

// Byte j of plane p (legacy_x8.h) of row r in a group's block, as the unsigned q_w + o.
template <GgmlType kType>
int32_t PlaneByte(const uint8_t* wb, int64_t r, int64_t p, int64_t j) {
  using F = LegacyX8Format<kType>;
  if constexpr (kType == GgmlType::kQ8_0) {
    return wb[F::kChunksAt + 32 * p + 4 * r + j] ^ 0x80;
  } else {
    const uint8_t q = wb[F::kChunksAt + 32 * (p / 2) + 4 * r + j];
    int32_t u = p % 2 == 0 ? q & 0x0F : q >> 4;
    if constexpr (kType == GgmlType::kQ5_0) {
      uint32_t qh;
      std::memcpy(&qh, wb + F::kQhAt + 4 * r, 4);
      u |= static_cast<int32_t>((qh >> (8 * j + p)) & 1) << 4;
    }
    return u;
  }
}

}  // namespace

int64_t LegacyX8InputBytes(int64_t cols) { return cols / kQK * kLegacyX8InputBlockBytes; }

void PackLegacyX8Input(const BlockQ8_0* q, int64_t n_blocks, int32_t offset, uint8_t* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* blk = out + b * kLegacyX8InputBlockBytes;
    const float d = Fp16ToFp32(q[b].d);
    int32_t sum = 0;
    for (int8_t v : q[b].qs) sum += v;
    const int32_t bias = -offset * sum;
    std::memcpy(blk, &d, 4);
    std::memcpy(blk + 4, &bias, 4);
    std::memcpy(blk + 8, q[b].qs, kQK);
  }
}

template <GgmlType kType>
void PrepareLegacyX8(const float* x, int64_t cols, uint8_t* out) {
  // ggml's reference rounding (QuantizeRow), then per block [f32 d][int32 bias][32 x int8].
  thread_local std::vector<BlockQ8_0> q;
  q.resize(cols / kQK);
  QuantizeRow(GgmlType::kQ8_0, x, q.data(), cols);
  PackLegacyX8Input(q.data(), cols / kQK, LegacyX8Offset(kType), out);
}

template <GgmlType kType>
void DotLegacyX8Portable(const RowSource& groups, int64_t n_groups, int64_t cols, const uint8_t* x,
                         int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  using F = LegacyX8Format<kType>;
  const int64_t n_blocks = cols / kQK;
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* group = groups.base + g * groups.row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const uint8_t* xt = x + t * x_stride;
      float acc[kLegacyX8Rows] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* wb = group + b * F::kBlockBytes;
        const uint8_t* xb = xt + b * kLegacyX8InputBlockBytes;
        float xd;
        int32_t bias;
        std::memcpy(&xd, xb, 4);
        std::memcpy(&bias, xb + 4, 4);
        const int8_t* xq = reinterpret_cast<const int8_t*>(xb + 8);
        for (int64_t r = 0; r < kLegacyX8Rows; ++r) {
          uint16_t dh;
          std::memcpy(&dh, wb + 2 * r, 2);
          int32_t sum = bias;
          for (int64_t p = 0; p < 8; ++p) {
            for (int64_t j = 0; j < 4; ++j) {
              sum += PlaneByte<kType>(wb, r, p, j) * xq[F::PlaneElement(p) + j];
            }
          }
          acc[r] = std::fma(Fp16ToFp32(dh) * xd, static_cast<float>(sum), acc[r]);
        }
      }
      std::memcpy(y + t * y_stride + g * kLegacyX8Rows, acc, sizeof acc);
    }
  }
}

#define THERMOCLINE_LEGACY_X8(T)                                                           \
  template void PrepareLegacyX8<T>(const float*, int64_t, uint8_t*);                       \
  template void DotLegacyX8Portable<T>(const RowSource&, int64_t, int64_t, const uint8_t*, \
                                       int64_t, int64_t, float*, int64_t);
THERMOCLINE_LEGACY_X8(GgmlType::kQ4_0)
THERMOCLINE_LEGACY_X8(GgmlType::kQ5_0)
THERMOCLINE_LEGACY_X8(GgmlType::kQ8_0)
#undef THERMOCLINE_LEGACY_X8

}  // namespace thermocline::matmul_internal
