#include "shared/model/quant.h"

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "shared/util/fp16.h"

namespace thermocline {

namespace {

// ggml casts these floats straight to int8; for finite inputs the value is always in range, but
// NaN/Inf inputs (or a subnormal scale whose inverse overflows) would make the cast undefined
// behaviour. Clamping keeps every in-range result bit-identical and defines the rest.
inline int8_t SaturateToInt8(float x) {
  if (!(x >= -128.0f)) return x != x ? 0 : -128;  // NaN -> 0
  if (x > 127.0f) return 127;
  return static_cast<int8_t>(x);
}

// Blocks are addressed through byte pointers with memcpy'd scales: a file with general.alignment
// 1 may place a block at an odd address, where a BlockQ8_0* dereference would be misaligned.
constexpr int64_t kQ8Bytes = sizeof(BlockQ8_0);
constexpr int64_t kQ4Bytes = sizeof(BlockQ4_0);
constexpr int64_t kQsOffset = offsetof(BlockQ8_0, qs);
static_assert(offsetof(BlockQ4_0, qs) == kQsOffset);

inline float LoadScale(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, sizeof h);
  return Fp16ToFp32(h);
}
inline void StoreScale(uint8_t* block, float d) {
  const uint16_t h = Fp32ToFp16(d);
  std::memcpy(block, &h, sizeof h);
}

void QuantizeRowQ8_0(const float* x, uint8_t* y, int64_t n) {
  const int64_t nb = n / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK;
    uint8_t* yb = y + i * kQ8Bytes;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float a = std::fabs(xb[j]);
      amax = amax > a ? amax : a;  // ggml's MAX(), including its NaN behaviour
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreScale(yb, d);
    for (int j = 0; j < kQK; ++j) {
      yb[kQsOffset + j] = static_cast<uint8_t>(SaturateToInt8(std::roundf(xb[j] * id)));
    }
  }
}

void QuantizeRowQ4_0(const float* x, uint8_t* y, int64_t n) {
  const int64_t nb = n / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xb = x + i * kQK;
    uint8_t* yb = y + i * kQ4Bytes;
    // The signed value of largest magnitude maps to -8, so the full 4-bit range [-8, 7] is used
    // on the side where it matters most (ggml's choice; needed for bit-identical files).
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float v = xb[j];
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreScale(yb, d);
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[kQK / 2 + j] * id;
      const int q0 = SaturateToInt8(x0 + 8.5f);
      const int q1 = SaturateToInt8(x1 + 8.5f);
      // ggml stores MIN(15, (int8_t)...) into a uint8; a negative value can only come from
      // non-finite inputs and is masked to a nibble rather than bleeding into its neighbour.
      const uint8_t xi0 = static_cast<uint8_t>(q0 < 15 ? q0 : 15) & 0x0F;
      const uint8_t xi1 = static_cast<uint8_t>(q1 < 15 ? q1 : 15) & 0x0F;
      yb[kQsOffset + j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

void DequantizeRowQ8_0(const uint8_t* x, float* y, int64_t n) {
  const int64_t nb = n / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* xb = x + i * kQ8Bytes;
    const float d = LoadScale(xb);
    for (int j = 0; j < kQK; ++j) {
      y[i * kQK + j] = static_cast<int8_t>(xb[kQsOffset + j]) * d;
    }
  }
}

void DequantizeRowQ4_0(const uint8_t* x, float* y, int64_t n) {
  const int64_t nb = n / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* xb = x + i * kQ4Bytes;
    const float d = LoadScale(xb);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t q = xb[kQsOffset + j];
      y[i * kQK + j] = ((q & 0x0F) - 8) * d;
      y[i * kQK + j + kQK / 2] = ((q >> 4) - 8) * d;
    }
  }
}

// Rounds to nearest (ties to even) and saturates; NaN becomes 0, so any float row converts.
int32_t FloatToI32(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 2147483647.0f) return std::numeric_limits<int32_t>::max();
  if (x <= -2147483648.0f) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(std::nearbyint(x));
}

}  // namespace

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  if (n <= 0) return;  // empty rows may come with null pointers, which memcpy must not see
  // Byte-wise loads: tensor data in a mapped file is only guaranteed the file's alignment.
  const uint8_t* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, s, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = Fp16ToFp32(h);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = Bf16ToFp32(h);
      }
      return;
    case GgmlType::kQ8_0:
      DequantizeRowQ8_0(s, dst, n);
      return;
    case GgmlType::kQ4_0:
      DequantizeRowQ4_0(s, dst, n);
      return;
    case GgmlType::kI32:
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, s + 4 * i, 4);
        dst[i] = static_cast<float>(v);
      }
      return;
  }
  std::abort();
}

void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n) {
  if (n <= 0) return;  // empty rows may come with null pointers, which memcpy must not see
  uint8_t* d = static_cast<uint8_t*>(dst);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(d, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = Fp32ToFp16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = Fp32ToBf16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case GgmlType::kQ8_0:
      QuantizeRowQ8_0(src, d, n);
      return;
    case GgmlType::kQ4_0:
      QuantizeRowQ4_0(src, d, n);
      return;
    case GgmlType::kI32:
      for (int64_t i = 0; i < n; ++i) {
        const int32_t v = FloatToI32(src[i]);
        std::memcpy(d + 4 * i, &v, 4);
      }
      return;
  }
  std::abort();
}

}  // namespace thermocline
