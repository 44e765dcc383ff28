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

// Block types with f32 activations (see TypeKernels): each block is dequantized by the
// reference DequantizeRow and multiplied exactly as FloatDot<F32Elem> multiplies an f32 row
// (block sizes are multiples of 8, so the eight partial sums see the same terms in the same
// order), which makes the result equal to the f32 kernel on the dequantized matrix.
template <GgmlType kType, int kBlock, int kBytes>
struct BlockType {
  static float Dot(const uint8_t* w, const uint8_t* xb, int64_t cols) {
    const float* x = reinterpret_cast<const float*>(xb);
    float acc[8] = {};
    float buf[kBlock];
    for (int64_t b = 0; b < cols / kBlock; ++b) {
      DequantizeRow(kType, w + b * kBytes, buf, kBlock);
      const float* xs = x + b * kBlock;
      for (int c = 0; c < kBlock; c += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += buf[c + j] * xs[c + j];
      }
    }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
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
  ForEachTile<4, 4>(
      rows, n_rows, n_tokens,
      [&](const uint8_t* const* w, const uint8_t* const*, int nr, int nt, int64_t i0, int64_t t0) {
        for (int t = 0; t < nt; ++t) {
          const uint8_t* xt = x + (t0 + t) * x_stride;
          float* yt = y + (t0 + t) * y_stride + i0;
          for (int r = 0; r < nr; ++r) yt[r] = K::Dot(w[r], xt, cols);
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
template <GgmlType kType, int kBlock, int kBytes>
constexpr TypeEntry Block() {
  using K = BlockType<kType, kBlock, kBytes>;
  return {kType, {&DotRows<K>, &AxpyRows<K>, &Dequantize<kType>}};
}

using T = GgmlType;
constexpr TypeEntry kEntries[] = {
    Float<T::kF32, FloatType<F32Elem>>(),
    Float<T::kF16, FloatType<F16Elem>>(),
    Float<T::kBF16, FloatType<Bf16Elem>>(),
    Q8Input<T::kQ8_0, QuantType<Q8Block>>(),
    Q8Input<T::kQ4_0, QuantType<Q4Block>>(),
    Block<T::kQ4_1, kQK, 20>(),
    Block<T::kQ5_0, kQK, 22>(),
    Block<T::kQ5_1, kQK, 24>(),
    Block<T::kIQ4_NL, kQK, 18>(),
    Block<T::kQ2_K, kQK_K, 84>(),
    Block<T::kQ3_K, kQK_K, 110>(),
    Block<T::kQ4_K, kQK_K, 144>(),
    Block<T::kQ5_K, kQK_K, 176>(),
    Block<T::kQ6_K, kQK_K, 210>(),
    Block<T::kIQ4_XS, kQK_K, 136>(),
};

constexpr KernelSet kPortable = {"portable", MakeTypeTable(kEntries), &QuantizeQ8_0};

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
