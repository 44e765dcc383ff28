// Plain C++ kernels: the fallback for CPUs without AVX2/FMA/F16C and the second opinion the
// tests compare the SIMD kernels against. Same math as matmul_avx2.cc up to float summation
// order (and FMA vs. separate multiply-add rounding).
#include <cstdint>
#include <cstring>

#include "shared/kernels/matmul_kernels.h"
#include "shared/gguf/quant.h"
#include "shared/util/fp16.h"

namespace thermocline::matmul_internal {
namespace {

// Rows may sit at any byte offset in a mapped file, so every load goes through memcpy.
inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Element loaders; an instance lives for one row (F16 keeps its table pointer there).
struct F32Elem {
  static constexpr int kBytes = 4;
  float Load(const uint8_t* p) const {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
};
struct F16Elem {
  static constexpr int kBytes = 2;
  const float* half = HalfToFloatTable();
  float Load(const uint8_t* p) const { return half[LoadU16(p)]; }
};
struct Bf16Elem {
  static constexpr int kBytes = 2;
  float Load(const uint8_t* p) const { return Bf16ToFp32(LoadU16(p)); }
};

// Eight independent partial sums let the compiler use SSE lanes without -ffast-math.
template <class E>
float FloatDot(const uint8_t* w, const float* x, int64_t cols) {
  const E e;
  float acc[8] = {};
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += e.Load(w + (c + j) * E::kBytes) * x[c + j];
  }
  for (int j = 0; c + j < cols; ++j) acc[j] += e.Load(w + (c + j) * E::kBytes) * x[c + j];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

constexpr int64_t kQsOffset = 2;  // both block types start with their fp16 scale

// Weight block -> 32 signed values.
struct Q8Block {
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static void Unpack(const uint8_t* b, int8_t* q) { std::memcpy(q, b + kQsOffset, kQK); }
};
struct Q4Block {
  static constexpr int64_t kBytes = sizeof(BlockQ4_0);
  static void Unpack(const uint8_t* b, int8_t* q) {
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t v = b[kQsOffset + j];
      q[j] = static_cast<int8_t>((v & 0x0F) - 8);
      q[j + kQK / 2] = static_cast<int8_t>((v >> 4) - 8);
    }
  }
};

// q5_0: nibble | bit e of qh << 4, minus 16; iq4_nl: the table value of each nibble.
struct Q5_0Block {
  static constexpr int64_t kBytes = 22;
  static void Unpack(const uint8_t* b, int8_t* q) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, sizeof qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t v = b[6 + j];
      q[j] = static_cast<int8_t>(((v & 0x0F) | (((qh >> j) & 1) << 4)) - 16);
      q[j + kQK / 2] = static_cast<int8_t>(((v >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
  }
};
struct Iq4nlBlock {
  static constexpr int64_t kBytes = 18;
  static void Unpack(const uint8_t* b, int8_t* q) {
    for (int j = 0; j < kQK / 2; ++j) {
      q[j] = kIq4nlValues[b[2 + j] & 0x0F];
      q[j + kQK / 2] = kIq4nlValues[b[2 + j] >> 4];
    }
  }
};

// q4_1, q5_1 (x = d * q + m): the unsigned q, nibbles as Q4_0, q5_1's bit 4 from qh.
template <bool kHigh>
struct Q4_1Block {
  static constexpr int64_t kBytes = kHigh ? 24 : 20;
  static void Unpack(const uint8_t* b, int8_t* q) {
    uint32_t qh = 0;
    if (kHigh) std::memcpy(&qh, b + 4, sizeof qh);
    const uint8_t* qs = b + (kHigh ? 8 : 4);
    for (int j = 0; j < kQK / 2; ++j) {
      q[j] = static_cast<int8_t>((qs[j] & 0x0F) | (((qh >> j) & 1) << 4));
      q[j + kQK / 2] = static_cast<int8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
  }
};

// As ggml's scalar vec_dot_q4_1_q8_1: (d_w * d_x) * sum q_w q_x + m_w * s_x per block, s_x the
// Q8_1 block's fp16 d_x * sum q_x.
template <class B>
struct MinQuantType {
  static float Dot(const uint8_t* w, const uint8_t* x, int64_t cols) {
    const float* half = HalfToFloatTable();
    float sum = 0.0f;
    int8_t qw[kQK];
    for (int64_t b = 0; b < cols / kQK; ++b) {
      const uint8_t* wb = w + b * B::kBytes;
      const uint8_t* xb = x + b * kQ8_1BlockBytes;
      B::Unpack(wb, qw);
      int32_t isum = 0;
      for (int j = 0; j < kQK; ++j) isum += qw[j] * static_cast<int8_t>(xb[4 + j]);
      sum += static_cast<float>(isum) * (half[LoadU16(wb)] * half[LoadU16(xb)]) +
             half[LoadU16(wb + 2)] * half[LoadU16(xb + 2)];
    }
    return sum;
  }
};

// As ggml's scalar vec_dot: an exact integer sum per block, scaled by d_w * d_x in f32.
template <class B>
float QuantDot(const uint8_t* w, const uint8_t* x, int64_t cols) {
  const float* half = HalfToFloatTable();
  float sum = 0.0f;
  int8_t qw[kQK];
  for (int64_t b = 0; b < cols / kQK; ++b) {
    const uint8_t* wb = w + b * B::kBytes;
    const uint8_t* xb = x + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    B::Unpack(wb, qw);
    int32_t isum = 0;
    for (int j = 0; j < kQK; ++j) isum += qw[j] * static_cast<int8_t>(xb[kQsOffset + j]);
    sum += static_cast<float>(isum) * (half[LoadU16(wb)] * half[LoadU16(xb)]);
  }
  return sum;
}

template <class E>
struct FloatType {
  static float Dot(const uint8_t* w, const uint8_t* x, int64_t cols) {
    return FloatDot<E>(w, reinterpret_cast<const float*>(x), cols);
  }
  static void Axpy(const uint8_t* w, float coeff, int64_t cols, float* y) {
    const E e;
    for (int64_t c = 0; c < cols; ++c) y[c] += coeff * e.Load(w + c * E::kBytes);
  }
};

template <class B>
struct QuantType {
  static float Dot(const uint8_t* w, const uint8_t* x, int64_t cols) {
    return QuantDot<B>(w, x, cols);
  }
  static void Axpy(const uint8_t* w, float coeff, int64_t cols, float* y) {
    const float* half = HalfToFloatTable();
    int8_t q[kQK];
    for (int64_t b = 0; b < cols / kQK; ++b) {
      const uint8_t* wb = w + b * B::kBytes;
      B::Unpack(wb, q);
      const float s = coeff * half[LoadU16(wb)];
      for (int j = 0; j < kQK; ++j) y[b * kQK + j] += s * static_cast<float>(q[j]);
    }
  }
};

// ---- K-quant and IQ4_XS weights against Q8_K activations (ggml's vec_dot_<type>_q8_K). ----
//
// A super-block decodes to 256 small integers q (as the product uses them), one integer scale
// per sub-block of kSub and, for types with mins, one integer min per sub-block; the weight is
// x = d * sc * q - dmin * mn (the f32 DequantizeRow value up to its own rounding). Against a
// Q8_K block (xd, xq, bsums) the block's dot product is then
//   (d * xd) * I - (dmin * xd) * M,  I = sum_s sc_s * sum_{l in s} q_l xq_l,  M = sum_s mn_s bsum_s
// with I and M exact int32 sums (|I| < 2^28 for every type) and four f32 roundings after them.
struct KBlockInts {
  int8_t q[kQK_K];
  int32_t sc[16];
  int32_t mn[16];
  float d, dmin;
};

// Byte offsets of ggml_type.h's layouts.
struct Q4KInts {
  static constexpr int64_t kBytes = 144;
  static constexpr int kSub = 32;
  static constexpr bool kHasMin = true;
  static void Decode(const uint8_t* b, KBlockInts* k) {
    const float* half = HalfToFloatTable();
    k->d = half[LoadU16(b)];
    k->dmin = half[LoadU16(b + 2)];
    for (int s = 0; s < 8; ++s) Q4KScaleMin(b + 4, s, &k->sc[s], &k->mn[s]);
    for (int e = 0; e < kQK_K; ++e) {
      const uint8_t v = b[16 + 32 * (e / 64) + e % 32];
      k->q[e] = static_cast<int8_t>((e / 32) % 2 ? v >> 4 : v & 0x0F);
    }
  }
};
struct Q5KInts {
  static constexpr int64_t kBytes = 176;
  static constexpr int kSub = 32;
  static constexpr bool kHasMin = true;
  static void Decode(const uint8_t* b, KBlockInts* k) {
    const float* half = HalfToFloatTable();
    k->d = half[LoadU16(b)];
    k->dmin = half[LoadU16(b + 2)];
    for (int s = 0; s < 8; ++s) Q4KScaleMin(b + 4, s, &k->sc[s], &k->mn[s]);
    for (int e = 0; e < kQK_K; ++e) {
      const uint8_t v = b[48 + 32 * (e / 64) + e % 32];
      const int low = (e / 32) % 2 ? v >> 4 : v & 0x0F;
      const int high = (b[16 + e % 32] >> (e / 32)) & 1;
      k->q[e] = static_cast<int8_t>(low | (high << 4));
    }
  }
};
struct Q6KInts {
  static constexpr int64_t kBytes = 210;
  static constexpr int kSub = 16;
  static constexpr bool kHasMin = false;
  static void Decode(const uint8_t* b, KBlockInts* k) {
    k->d = HalfToFloatTable()[LoadU16(b + 208)];
    k->dmin = 0.0f;
    for (int g = 0; g < 16; ++g) k->sc[g] = static_cast<int8_t>(b[192 + g]);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, el = e % 128;
      const uint8_t v = b[64 * h + el % 64];
      const int low = el / 64 ? v >> 4 : v & 0x0F;
      const int high = (b[128 + 32 * h + el % 32] >> (2 * (el / 32))) & 3;
      k->q[e] = static_cast<int8_t>((low | (high << 4)) - 32);
    }
  }
};
struct Q2KInts {
  static constexpr int64_t kBytes = 84;
  static constexpr int kSub = 16;
  static constexpr bool kHasMin = true;
  static void Decode(const uint8_t* b, KBlockInts* k) {
    const float* half = HalfToFloatTable();
    k->d = half[LoadU16(b + 80)];
    k->dmin = half[LoadU16(b + 82)];
    for (int g = 0; g < 16; ++g) {
      k->sc[g] = b[g] & 0x0F;
      k->mn[g] = b[g] >> 4;
    }
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      k->q[e] = static_cast<int8_t>((b[16 + 32 * h + l] >> (2 * s)) & 3);
    }
  }
};
struct Q3KInts {
  static constexpr int64_t kBytes = 110;
  static constexpr int kSub = 16;
  static constexpr bool kHasMin = false;
  static void Decode(const uint8_t* b, KBlockInts* k) {
    k->d = HalfToFloatTable()[LoadU16(b + 108)];
    k->dmin = 0.0f;
    for (int g = 0; g < 16; ++g) k->sc[g] = Q3KScale(b + 96, g);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      const int low = (b[32 + 32 * h + l] >> (2 * s)) & 3;
      const bool high = (b[l] >> (e / 32)) & 1;
      k->q[e] = static_cast<int8_t>(low - (high ? 0 : 4));
    }
  }
};
struct Iq4xsInts {
  static constexpr int64_t kBytes = 136;
  static constexpr int kSub = 32;
  static constexpr bool kHasMin = false;
  static void Decode(const uint8_t* b, KBlockInts* k) {
    k->d = HalfToFloatTable()[LoadU16(b)];
    k->dmin = 0.0f;
    for (int s = 0; s < 8; ++s) {
      k->sc[s] = Iq4xsScale(b, s);
      for (int l = 0; l < 16; ++l) {
        const uint8_t v = b[8 + 16 * s + l];
        k->q[32 * s + l] = kIq4nlValues[v & 0x0F];
        k->q[32 * s + l + 16] = kIq4nlValues[v >> 4];
      }
    }
  }
};

template <class B>
struct KQuantType {
  static float Dot(const uint8_t* w, const uint8_t* x, int64_t cols) {
    float sum = 0.0f;
    KBlockInts k;
    for (int64_t b = 0; b < cols / kQK_K; ++b) {
      B::Decode(w + b * B::kBytes, &k);
      const uint8_t* xb = x + b * kQ8KBlockBytes;
      float xd;
      std::memcpy(&xd, xb, sizeof xd);
      const int8_t* xq = reinterpret_cast<const int8_t*>(xb + 4);
      int32_t isum = 0;
      for (int s = 0; s < kQK_K / B::kSub; ++s) {
        int32_t p = 0;
        for (int l = s * B::kSub; l < (s + 1) * B::kSub; ++l) p += k.q[l] * xq[l];
        isum += k.sc[s] * p;
      }
      sum += (k.d * xd) * static_cast<float>(isum);
      if constexpr (B::kHasMin) {
        int32_t msum = 0;
        for (int g = 0; g < 16; ++g) {
          int16_t bsum;
          std::memcpy(&bsum, xb + 4 + kQK_K + 2 * g, sizeof bsum);
          msum += k.mn[g * 16 / B::kSub] * bsum;
        }
        sum -= (k.dmin * xd) * static_cast<float>(msum);
      }
    }
    return sum;
  }
};

// Block types decoded to f32 for AxpyRows (every block type but q8_0 / q4_0): each block is
// dequantized by the reference DequantizeRow and added exactly as the f32 kernel adds an f32 row.
template <GgmlType kType, int kBlock, int kBytes>
struct BlockType {
  static void Axpy(const uint8_t* w, float coeff, int64_t cols, float* y) {
    float buf[kBlock];
    for (int64_t b = 0; b < cols / kBlock; ++b) {
      DequantizeRow(kType, w + b * kBytes, buf, kBlock);
      for (int c = 0; c < kBlock; ++c) y[b * kBlock + c] += coeff * buf[c];
    }
  }
};

template <class K>
void DotRows(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
             int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  ForEachTile<4, 4>(rows, n_rows, n_tokens, y, y_stride,
                    [&](const uint8_t* const* w, const uint8_t* const*, int nr, int nt, int64_t t0,
                        float* yt, int64_t yt_stride) {
                      for (int t = 0; t < nt; ++t) {
                        const uint8_t* xt = x + (t0 + t) * x_stride;
                        for (int r = 0; r < nr; ++r) yt[t * yt_stride + r] = K::Dot(w[r], xt, cols);
                      }
                    });
}

template <class K>
void AxpyRows(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols, float* y) {
  for (int64_t i = 0; i < n_rows; ++i) K::Axpy(rows.row(i), coeffs[i], cols, y);
}

template <GgmlType kType>
void Dequantize(const uint8_t* row, int64_t cols, float* out) {
  DequantizeRow(kType, row, out, cols);
}

// The portable kernels read plain BlockQ8_0 activations.
int64_t InputBytes(int64_t cols) { return RowBytes(GgmlType::kQ8_0, cols); }

void PrepareInput(const float* x, int64_t cols, uint8_t* out) {
  QuantizeRow(GgmlType::kQ8_0, x, out, cols);
}

int64_t Q8KInputBytes(int64_t cols) { return cols / kQK_K * kQ8KBlockBytes; }

void PrepareQ8K(const float* x, int64_t cols, uint8_t* out) { QuantizeRowQ8_K(x, out, cols); }

void QuantizeQ8_0(const float* x, uint8_t* blocks, int64_t n) {
  QuantizeRow(GgmlType::kQ8_0, x, blocks, n);
}

template <GgmlType kType, class K>
constexpr TypeEntry Float() {
  return {kType, {&DotRows<K>, &AxpyRows<K>, &Dequantize<kType>}};
}
template <GgmlType kType, class K>
constexpr TypeEntry Q8Input() {
  return {kType, {&DotRows<K>, &AxpyRows<K>, &Dequantize<kType>, &InputBytes, &PrepareInput}};
}
// Dot through the Q8_0 integer kernel, axpy and dequantize through the f32 decode.
template <GgmlType kType, class B>
constexpr TypeEntry Q8InputDecoded() {
  using F = BlockType<kType, kQK, static_cast<int>(B::kBytes)>;
  return {kType,
          {&DotRows<QuantType<B>>, &AxpyRows<F>, &Dequantize<kType>, &InputBytes, &PrepareInput}};
}
int64_t Q8_1InputBytes(int64_t cols) { return cols / kQK * kQ8_1BlockBytes; }
void PrepareQ8_1(const float* x, int64_t cols, uint8_t* out) { QuantizeRowQ8_1(x, out, cols); }

// Dot against Q8_1 activations, axpy and dequantize through the f32 decode.
template <GgmlType kType, class B>
constexpr TypeEntry Q8_1Input() {
  using F = BlockType<kType, kQK, static_cast<int>(B::kBytes)>;
  return {kType,
          {&DotRows<MinQuantType<B>>, &AxpyRows<F>, &Dequantize<kType>, &Q8_1InputBytes,
           &PrepareQ8_1}};
}
// Dot through the integer kernel, axpy and dequantize through the f32 decode (the sparse
// down_t path multiplies f32 coefficients into rows).
template <GgmlType kType, class B, int kBlock>
constexpr TypeEntry Q8KInput() {
  using F = BlockType<kType, kBlock, static_cast<int>(B::kBytes)>;
  return {kType,
          {&DotRows<KQuantType<B>>, &AxpyRows<F>, &Dequantize<kType>, &Q8KInputBytes,
           &PrepareQ8K}};
}

using T = GgmlType;
constexpr TypeEntry kEntries[] = {
    Float<T::kF32, FloatType<F32Elem>>(),
    Float<T::kF16, FloatType<F16Elem>>(),
    Float<T::kBF16, FloatType<Bf16Elem>>(),
    Q8Input<T::kQ8_0, QuantType<Q8Block>>(),
    Q8Input<T::kQ4_0, QuantType<Q4Block>>(),
    Q8_1Input<T::kQ4_1, Q4_1Block<false>>(),
    Q8InputDecoded<T::kQ5_0, Q5_0Block>(),
    Q8_1Input<T::kQ5_1, Q4_1Block<true>>(),
    Q8InputDecoded<T::kIQ4_NL, Iq4nlBlock>(),
    Q8KInput<T::kQ2_K, Q2KInts, kQK_K>(),
    Q8KInput<T::kQ3_K, Q3KInts, kQK_K>(),
    Q8KInput<T::kQ4_K, Q4KInts, kQK_K>(),
    Q8KInput<T::kQ5_K, Q5KInts, kQK_K>(),
    Q8KInput<T::kQ6_K, Q6KInts, kQK_K>(),
    Q8KInput<T::kIQ4_XS, Iq4xsInts, kQK_K>(),
};

constexpr KernelSet kPortable = {
    "portable", MakeTypeTable(kEntries), &QuantizeQ8_0,
    Interleaved8Table<kLegacyX8Portable<GgmlType::kQ4_0>, kLegacyX8Portable<GgmlType::kQ5_0>,
                      kLegacyX8Portable<GgmlType::kQ8_0>, kQ3_Kx8Portable, kQ4_Kx8Portable,
                      kQ5_Kx8Portable, kQ6_Kx8Portable, kIq4_XSx8Portable>(),
    IntAxpyTable(&IntAxpyQ4_0Portable)};

}  // namespace

const KernelSet& PortableKernels() { return kPortable; }

const float* HalfToFloatTable() {
  static const float* const table = [] {
    float* t = new float[1 << 16];  // lives as long as the process
    for (uint32_t h = 0; h < (1u << 16); ++h) t[h] = Fp16ToFp32(static_cast<uint16_t>(h));
    return t;
  }();
  return table;
}

}  // namespace thermocline::matmul_internal
