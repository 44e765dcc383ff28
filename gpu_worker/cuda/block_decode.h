// Element decoders of ggml's block types for the hot FFN kernels (kernels.cu), in one header that
// nvcc compiles for the device and the host compiler for tests/unit/cuda_block_decode_test.cc,
// which checks every type against shared/gguf's DequantizeRow bit for bit on the host. Layouts:
// shared/gguf/ggml_type.h. Each decoder D gives the float value of element c of a row:
//   D::kBlockElems, D::kBlockBytes      the block's elements and bytes
//   D::Element(row, c)                  with the float operations of quant.cc's dequantizer
// Plain C++17 without CUDA headers on the host, so that the test needs no CUDA.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define TC_HD __host__ __device__ __forceinline__
#else
#define TC_HD inline
#endif

namespace thermocline::gpu_worker::cuda::blocks {

// IEEE binary16 bits to float, exactly (normal, subnormal, zero, infinity, NaN).
TC_HD float HalfToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1Fu) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

TC_HD float Scale(const uint8_t* p) {
  return HalfToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

TC_HD int Iq4nlValue(int q) {
  // ggml's kvalues_iq4nl (ggml_type.h kIq4nlValues), as a switch: no table in device memory.
  constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
  return kValues[q & 0x0F];
}

struct Q8_0 {  // [d, qs[32]]
  static constexpr int kBlockElems = 32, kBlockBytes = 34;
  TC_HD static float Element(const uint8_t* row, int64_t c) {
    const uint8_t* b = row + (c / 32) * kBlockBytes;
    return static_cast<float>(static_cast<int8_t>(b[2 + c % 32])) * Scale(b);
  }
};

// Q4_0, Q4_1, Q5_0, Q5_1: element j < 16 the low nibble of qs[j], j >= 16 the high nibble of
// qs[j - 16]; Q5 adds bit j of qh as bit 4; with a minimum x = d q + m, else d (q - 8 or 16).
template <bool kHasMin, bool kHasHigh>
struct Legacy {
  static constexpr int kQsAt = 2 + (kHasMin ? 2 : 0) + (kHasHigh ? 4 : 0);
  static constexpr int kBlockElems = 32, kBlockBytes = kQsAt + 16;
  TC_HD static float Element(const uint8_t* row, int64_t c) {
    const uint8_t* b = row + (c / 32) * kBlockBytes;
    const int j = static_cast<int>(c % 32);
    const uint8_t byte = b[kQsAt + j % 16];
    int q = j < 16 ? (byte & 0x0F) : (byte >> 4);
    if (kHasHigh) {
      const uint8_t* qh = b + 2 + (kHasMin ? 2 : 0);
      q |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
    }
    const float d = Scale(b);
    if (kHasMin) return d * static_cast<float>(q) + Scale(b + 2);
    return d * static_cast<float>(q - (kHasHigh ? 16 : 8));
  }
};
using Q4_0 = Legacy<false, false>;
using Q4_1 = Legacy<true, false>;
using Q5_0 = Legacy<false, true>;
using Q5_1 = Legacy<true, true>;

struct Q2_K {  // [scales[16], qs[64], d, dmin]
  static constexpr int kBlockElems = 256, kBlockBytes = 84;
  TC_HD static float Element(const uint8_t* row, int64_t c) {
    const uint8_t* b = row + (c / 256) * kBlockBytes;
    const int e = static_cast<int>(c % 256);
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    const int q = (b[16 + 32 * h + l] >> (2 * s)) & 3;
    const uint8_t sc = b[e / 16];
    const float dl = Scale(b + 80) * static_cast<float>(sc & 0x0F);
    const float ml = Scale(b + 82) * static_cast<float>(sc >> 4);
    return dl * static_cast<float>(q) - ml;
  }
};

struct Q3_K {  // [hmask[32], qs[64], scales[12], d]
  static constexpr int kBlockElems = 256, kBlockBytes = 110;
  TC_HD static float Element(const uint8_t* row, int64_t c) {
    const uint8_t* b = row + (c / 256) * kBlockBytes;
    const int e = static_cast<int>(c % 256);
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    const int low = (b[32 + 32 * h + l] >> (2 * s)) & 3;
    const int q = low - (((b[l] >> (e / 32)) & 1) ? 0 : 4);
    // The 16 six-bit scales: low four bits from bytes 0..7, the top two from bytes 8..11.
    const uint8_t* sc = b + 96;
    const int j = e / 16;
    const int sl = j < 8 ? (sc[j] & 0x0F) : (sc[j - 8] >> 4);
    const int sh = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    const float dl = Scale(b + 108) * static_cast<float>((sl | (sh << 4)) - 32);
    return dl * static_cast<float>(q);
  }
};

// Q4_K [d, dmin, scales[12], qs[128]] and Q5_K [d, dmin, scales[12], qh[32], qs[128]].
template <bool kHigh>
struct Q45_K {
  static constexpr int kBlockElems = 256, kBlockBytes = kHigh ? 176 : 144;
  TC_HD static float Element(const uint8_t* row, int64_t c) {
    const uint8_t* b = row + (c / 256) * kBlockBytes;
    const int e = static_cast<int>(c % 256);
    const int sub = e / 32, l = e % 32;
    const uint8_t* scales = b + 4;
    int sc, m;
    if (sub < 4) {
      sc = scales[sub] & 0x3F;
      m = scales[sub + 4] & 0x3F;
    } else {
      sc = (scales[sub + 4] & 0x0F) | ((scales[sub - 4] >> 6) << 4);
      m = (scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4);
    }
    const uint8_t* qs = b + (kHigh ? 48 : 16);
    int q = (qs[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0x0F;
    if (kHigh) q |= ((b[16 + l] >> sub) & 1) << 4;
    const float d1 = Scale(b) * static_cast<float>(sc);
    const float m1 = Scale(b + 2) * static_cast<float>(m);
    return d1 * static_cast<float>(q) - m1;
  }
};
using Q4_K = Q45_K<false>;
using Q5_K = Q45_K<true>;

struct Q6_K {  // [ql[128], qh[64], scales[16] (int8), d]
  static constexpr int kBlockElems = 256, kBlockBytes = 210;
  TC_HD static float Element(const uint8_t* row, int64_t c) {
    const uint8_t* b = row + (c / 256) * kBlockBytes;
    const int e = static_cast<int>(c % 256);
    const int h = e / 128, r = e % 128;
    const int low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
    const int q = (low | (high << 4)) - 32;
    const float dl = Scale(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + e / 16]));
    return dl * static_cast<float>(q);
  }
};

struct IQ4_NL {  // [d, qs[16]]: nibbles as Q4_0's, through the non-linear table
  static constexpr int kBlockElems = 32, kBlockBytes = 18;
  TC_HD static float Element(const uint8_t* row, int64_t c) {
    const uint8_t* b = row + (c / 32) * kBlockBytes;
    const int j = static_cast<int>(c % 32);
    const uint8_t byte = b[2 + j % 16];
    return Scale(b) * static_cast<float>(Iq4nlValue(j < 16 ? byte : byte >> 4));
  }
};

struct IQ4_XS {  // [d, scales_h (u16), scales_l[4], qs[128]]
  static constexpr int kBlockElems = 256, kBlockBytes = 136;
  TC_HD static float Element(const uint8_t* row, int64_t c) {
    const uint8_t* b = row + (c / 256) * kBlockBytes;
    const int e = static_cast<int>(c % 256);
    const int sub = e / 32, j = e % 32;
    const int scales_h = b[2] | (b[3] << 8);
    const int sl = (b[4 + sub / 2] >> (4 * (sub % 2))) & 0x0F;
    const int sh = (scales_h >> (2 * sub)) & 3;
    const float dl = Scale(b) * static_cast<float>((sl | (sh << 4)) - 32);
    const uint8_t byte = b[8 + 16 * sub + j % 16];
    return dl * static_cast<float>(Iq4nlValue(j < 16 ? byte : byte >> 4));
  }
};

}  // namespace thermocline::gpu_worker::cuda::blocks
