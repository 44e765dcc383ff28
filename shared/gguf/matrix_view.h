// A weight matrix as a view into memory (usually the mapped model file): the one type the model
// description, the kernels and the backends share. It lives below the kernels so that describing
// a model never depends on how it is computed.
#pragma once

#include <cstdint>

#include "shared/gguf/ggml_type.h"

namespace thermocline {

struct MatrixView {
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;  // a multiple of the type's block size
  const uint8_t* data = nullptr;
  int64_t row_bytes = 0;  // RowBytes(type, cols) for a packed tensor
  // Optional second copy of the same weights in a layout made for dense products (Q4_0, Q5_0,
  // Q8_0, Q4_K, Q5_K, Q6_K: the 8-row interleaved groups of interleaved8.h), set at load for
  // matrices that are only ever used densely. MatMul reads it when the kernels have that
  // layout; everything that needs single rows (GatherMatMul, AxpyRows, dequantization, other
  // backends) keeps reading `data`.
  const uint8_t* interleaved = nullptr;

  const uint8_t* row(int64_t r) const { return data + r * row_bytes; }
  // Bytes of one row's values. row_bytes is the stride between rows: equal for a packed tensor,
  // larger in a strided view (a neuron bundle's, sparsity/neuron_bundle.h). What a row costs
  // to read is this, not the stride.
  int64_t row_data_bytes() const { return RowBytes(type, cols); }
  bool empty() const { return rows == 0; }
  // Rows [begin, begin + n) as a matrix of their own (fused tensors such as attn_qkv hold
  // several projections one after the other).
  MatrixView RowRange(int64_t begin, int64_t n) const {
    MatrixView m = *this;
    m.rows = n;
    m.data = data + begin * row_bytes;
    m.interleaved = nullptr;  // a group may straddle the range; interleave the part instead
    return m;
  }
};

}  // namespace thermocline
