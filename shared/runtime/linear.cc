#include "shared/runtime/linear.h"

#include <array>
#include <cstdlib>

#include "shared/kernels/matmul.h"

namespace thermocline {

std::string_view ProjectionName(Projection p) {
  switch (p) {
    case Projection::kQ:
      return "q";
    case Projection::kK:
      return "k";
    case Projection::kV:
      return "v";
    case Projection::kO:
      return "o";
    case Projection::kGate:
      return "gate";
    case Projection::kUp:
      return "up";
    case Projection::kDown:
      return "down";
  }
  return "?";
}

void DenseProducts(std::span<const LinearExecutor::Output> outs, const float* x, int64_t x_stride,
                   int64_t t0, int64_t t1, ThreadPool& pool) {
  if (t1 <= t0) return;
  if (outs.size() > kMaxMatMulMany) std::abort();  // a programming error (matmul.h)
  std::array<MatMulOutput, kMaxMatMulMany> dense;
  for (size_t i = 0; i < outs.size(); ++i) {
    dense[i] = {outs[i].w, outs[i].y + t0 * outs[i].y_stride, outs[i].y_stride};
  }
  MatMulMany(std::span(dense.data(), outs.size()), x + t0 * x_stride, t1 - t0, x_stride, pool);
}

void Products(LinearExecutor* linear, int64_t layer, std::span<const LinearExecutor::Output> outs,
              const float* x, int64_t n, int64_t x_stride, ThreadPool& pool) {
  if (linear != nullptr) {
    linear->ApplyShared(layer, outs, x, n, x_stride);
  } else {
    DenseProducts(outs, x, x_stride, 0, n, pool);
  }
}

}  // namespace thermocline
