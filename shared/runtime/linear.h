// The weight products of a layer (q, k, v, o and the FFN's gate, up, down) behind one
// interface, so that an input-sparse executor (sparsity/teal.h) can replace any of them without
// the forward pass or the dense FFN knowing how. Without one, they call MatMul directly.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "shared/gguf/matrix_view.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

enum class Projection : int8_t { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumProjections = 7;

// "q", "k", "v", "o", "gate", "up", "down".
std::string_view ProjectionName(Projection p);

class LinearExecutor {
 public:
  virtual ~LinearExecutor() = default;
  // Called by the forward pass before each batch: decode[e] is 1 when entry e is the only entry
  // of its slot in the batch (one new token of a sequence: a decode position), 0 when its slot
  // has several (a prompt). The span stays valid until the next call.
  virtual void BeginBatch(std::span<const uint8_t> decode) = 0;
  // y[t * y_stride + r] = sum_c W[r][c] * x[t * x_stride + c] for the n rows of the batch in
  // order (row t is entry t), as MatMul. `w` is the model's matrix for (layer, p); for kDown it
  // may be the model's ffn_down_t ([ffn_dim][dim], one row per input) when `transposed`.
  virtual void Apply(int64_t layer, Projection p, const MatrixView& w, bool transposed,
                     const float* x, int64_t n, int64_t x_stride, float* y, int64_t y_stride) = 0;

  // Several products of one input (q, k, v; gate, up), each as Apply computes it; an executor
  // may do them together. This one calls Apply per output.
  struct Output {
    Projection p;
    const MatrixView* w;
    float* y;
    int64_t y_stride;
  };
  virtual void ApplyShared(int64_t layer, std::span<const Output> outs, const float* x, int64_t n,
                           int64_t x_stride) {
    for (const Output& o : outs) Apply(layer, o.p, *o.w, false, x, n, x_stride, o.y, o.y_stride);
  }
};

// Rows [t0, t1) of x ([.][x_stride]) into the same rows of every output, dense: one MatMulMany
// (one region, one rounding of the input), MatMul's bits per output.
void DenseProducts(std::span<const LinearExecutor::Output> outs, const float* x, int64_t x_stride,
                   int64_t t0, int64_t t1, ThreadPool& pool);
// The n rows of x through `linear`'s ApplyShared, or DenseProducts without an executor.
void Products(LinearExecutor* linear, int64_t layer, std::span<const LinearExecutor::Output> outs,
              const float* x, int64_t n, int64_t x_stride, ThreadPool& pool);

}  // namespace thermocline
