// Internal interface between matmul.cc (threading, activation quantization, dispatch) and the
// per-ISA kernel files (matmul_portable.cc, matmul_avx2.cc). Not for use outside shared/kernels/
// and its tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "shared/model/ggml_type.h"

namespace thermocline::matmul_internal {

// Rows of a weight matrix addressed either consecutively from `base` or through an id list
// (the sparse FFN gathers rows by neuron id).
struct RowSource {
  const uint8_t* base = nullptr;
  int64_t row_bytes = 0;
  const int32_t* ids = nullptr;  // nullptr: row i is base + i * row_bytes

  const uint8_t* row(int64_t i) const { return base + (ids != nullptr ? ids[i] : i) * row_bytes; }
};

// Kernels for one weight type at one SIMD level.
struct TypeKernels {
  // y[t * y_stride + i] = dot(rows.row(i), x_t) for i < n_rows, t < n_tokens, where
  // x_t = x + t * x_stride bytes holds `cols` f32 values for float weight types and the
  // set's prepared activations (see KernelSet::prepare_input) for quantized ones. Every (i, t) dot
  // product is computed with the same sequence of operations whatever the tile it falls in, so
  // batching tokens never changes a result.
  void (*dot)(const RowSource& rows, int64_t n_rows, int64_t cols, const uint8_t* x,
              int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);
  // y[c] += sum_i coeffs[i] * rows.row(i)[c] for c < cols, rows added in order.
  void (*axpy)(const RowSource& rows, const float* coeffs, int64_t n_rows, int64_t cols, float* y);
};

struct KernelSet {
  const char* name;
  TypeKernels f32, f16, bf16, q8_0, q4_0;
  // Activations for quantized weights are prepared once per call in a layout of the set's own
  // choosing: input_bytes(cols) bytes per token, written by prepare_input for weights of `type`.
  // The Q8_0 quantization inside is bit-identical to QuantizeRow(kQ8_0) for finite input.
  int64_t (*input_bytes)(int64_t cols);
  void (*prepare_input)(GgmlType type, const float* x, int64_t cols, uint8_t* out);
  // The same quantization written as plain BlockQ8_0 (lets tests compare it with QuantizeRow).
  void (*quantize_q8_0)(const float* x, uint8_t* blocks, int64_t n);

  const TypeKernels& For(GgmlType type) const {
    switch (type) {
      case GgmlType::kF32:
        return f32;
      case GgmlType::kF16:
        return f16;
      case GgmlType::kBF16:
        return bf16;
      case GgmlType::kQ8_0:
        return q8_0;
      case GgmlType::kQ4_0:
        return q4_0;
      default:
        break;
    }
    // Matrices are only built over weight types (loaders validate them); anything else is a
    // programming error, stopped here rather than computed as garbage.
    std::abort();
  }
};

const KernelSet& PortableKernels();
// Only valid on a CPU with AVX2, FMA and F16C; with `vnni`, AVX-VNNI too (it only changes how
// the quantized kernels form their exact integer block sums, so results are bit-identical).
const KernelSet& Avx2Kernels(bool vnni);
bool CpuHasAvx2();
bool CpuHasAvxVnni();

// f32 value of every fp16 bit pattern (256 KiB, built on first use). A lookup is cheaper than
// the arithmetic conversion in portable code and than F16C's insert-convert-broadcast for a
// single scale in the AVX2 kernels; only entries of values that occur are ever touched.
const float* HalfToFloatTable();

inline bool IsQuantized(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0;
}

// A block of rows sized to stay in L2 while every token tile passes over it, so that with many
// tokens each weight byte comes from memory once (the activations of a token tile stay in L1).
inline constexpr int64_t kRowBlockBytes = 256 << 10;

// Walks the n_rows x n_tokens output in tiles of at most R rows by T tokens and calls
// tile(row_ptrs, next_ptrs, n_tile_rows, n_tile_tokens, first_row, first_token) for each. With
// one token tile the rows simply stream; otherwise rows go in L2-sized blocks, all tokens per
// block. While the weights still come from memory (the first token tile) next_ptrs holds the R
// rows of the following row tile for the kernel to prefetch: a whole tile ahead hides DRAM
// latency even for short or gathered (scattered) rows, where the hardware prefetcher has no
// long stream to follow. Elsewhere it is nullptr.
template <int R, int T, class TileFn>
inline void ForEachTile(const RowSource& rows, int64_t n_rows, int64_t n_tokens, TileFn&& tile) {
  int64_t block = n_rows;
  if (n_tokens > T) {
    block = std::max<int64_t>(R, kRowBlockBytes / std::max<int64_t>(1, rows.row_bytes) / R * R);
  }
  for (int64_t b0 = 0; b0 < n_rows; b0 += block) {
    const int64_t b1 = std::min(n_rows, b0 + block);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, n_tokens - t0));
      for (int64_t i = b0; i < b1; i += R) {
        const int nr = static_cast<int>(std::min<int64_t>(R, b1 - i));
        const uint8_t* ptrs[R];
        const uint8_t* next[R];
        for (int k = 0; k < nr; ++k) ptrs[k] = rows.row(i + k);
        const bool prefetch = t0 == 0 && i + R < n_rows;
        if (prefetch) {
          for (int k = 0; k < R; ++k) next[k] = rows.row(std::min(i + R + k, n_rows - 1));
        }
        tile(ptrs, prefetch ? next : nullptr, nr, nt, i, t0);
      }
    }
  }
}

}  // namespace thermocline::matmul_internal
