// Dense matrix-vector and matrix-matrix products over weights of any supported type.
//
// Weights are stored row-major as [rows][cols] (ggml: ne[0] = cols), one output per row.
// For F32/F16/BF16 weights the activations stay f32; for quantized types they are first
// quantized once per call, as llama.cpp does, to Q8_0 blocks (Q8_0, Q4_0, Q5_0, IQ4_NL), Q8_1
// blocks (Q4_1, Q5_1) or Q8_K blocks (the K-quants, IQ4_XS), with ggml's reference rounding bit
// for bit, so the inner loop is an exact integer dot product per block (matmul_kernels.h).
// AVX2/FMA/F16C kernels are used when the CPU has them (see cpu_features.h; AVX-VNNI too for the
// quantized types, with identical results), else portable C++.
//
// Every output element is one dot product computed by one thread in a fixed operation order, so
// MatMul's result does not depend on the pool size, on how rows are split (MatMulRows), or on
// how many tokens share a call: a batch of n tokens equals n single-token calls bit for bit, and
// GatherMatMul equals the matching rows of MatMul bit for bit.
//
// A view with an interleaved copy (MatrixView::interleaved: shared/gguf/interleaved8.h)
// is multiplied from that copy by MatMul and MatMulRows when the kernel family has the layout;
// the guarantees above hold among those calls, while its results differ from the row layout's
// (and so from GatherMatMul's) by rounding only: the block sums are the same exact integers,
// added in another order (bound: tests/unit/q4_0x8_test.cc). GatherMatMul, AxpyRows and
// DequantizeMatrixRow always read the row layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "shared/gguf/ggml_type.h"
#include "shared/gguf/matrix_view.h"
#include "shared/util/thread_pool.h"

namespace thermocline {


// y[t * y_stride + r] = sum_c W[r][c] * x[t * x_stride + c] for t < n_tokens, r < w.rows.
// Work is split over the pool's threads by rows; each thread streams its rows once for all tokens.
void MatMul(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
            int64_t y_stride, ThreadPool& pool);

// Several products of the same input: outs[i].y = outs[i].w x, bit for bit what one MatMul
// per output gives, with the input prepared once per form the weights read (Q8_0, Q8_K, ...)
// and the rows of all outputs cut into one parallel region. A decode step does this for q, k
// and v, and for gate and up: each region and each preparation saved is a hand-off between
// threads and a serial pass over the input saved (docs/performance.md). At most
// kMaxMatMulMany outputs; empty matrices are skipped.
struct MatMulOutput {
  const MatrixView* w;
  float* y;
  int64_t y_stride;
};
inline constexpr size_t kMaxMatMulMany = 4;
void MatMulMany(std::span<const MatMulOutput> outs, const float* x, int64_t n_tokens,
                int64_t x_stride, ThreadPool& pool);

// Single-threaded form over rows [row_begin, row_end), for callers that split work themselves.
void MatMulRows(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
                int64_t y_stride, int64_t row_begin, int64_t row_end);

// One row of W dequantized into f32 (used for embedding lookups).
void DequantizeMatrixRow(const MatrixView& w, int64_t r, float* out);

// Sparse forms for the FFN's active neurons; every id must be in [0, w.rows).
//
// y[i] = dot(W row row_ids[i], x) for i < n_ids, one token (x has w.cols values). Quantized
// weights quantize x once per call, as MatMul does.
void GatherMatMul(const MatrixView& w, const int32_t* row_ids, int64_t n_ids, const float* x,
                  float* y, ThreadPool& pool);

// How far ahead the sparse kernels prefetch gathered rows (matmul_kernels.h,
// kPrefetchAheadBytes, has the measurement): public for the benchmarks that time a plain read of
// the same rows as the kernels read them (util/membw.h, TimeScatteredRead).
inline constexpr int64_t kGatherPrefetchAheadBytes = 32 << 10;

// y[c] += sum_i coeffs[i] * W[row_ids[i]][c] for c < w.cols (the down projection stored one row
// per neuron). Threads split the ids and sum into private partials that are then added to y, so
// the summation order (and the last bits of y) depend on the pool size, never on timing.
void AxpyRows(const MatrixView& w, const int32_t* row_ids, const float* coeffs, int64_t n_ids,
              float* y, ThreadPool& pool);

// AxpyRows' sum with integer products, for TEAL's input-sparse products over Q4_0 copies
// (sparsity/teal.h), on the calling thread: per group of 16 ids in order and block of 32
// columns, each coefficient times the row's block scale is rounded to 8 bits against the
// group's largest (as a quantized GEMV rounds its activations), the block's column sums are
// exact integers, and each is scaled into y once: y[c] += s * n_c. Per term the rounding errs by
// at most max_i |coeffs[i] * d_i| / 254 times |q_c - 8|; the bits are the same in every kernel
// family (matmul_kernels.h has the exact operations). Only for types HasIntAxpy names (Q4_0).
bool HasIntAxpy(GgmlType type);
void IntAxpyRows(const MatrixView& w, const int32_t* row_ids, const float* coeffs, int64_t n_ids,
                 float* y);

}  // namespace thermocline
