#include "shared/kernels/matmul.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <vector>

#include "shared/kernels/dispatch.h"
#include "shared/gguf/interleaved8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/cpu_features.h"

namespace thermocline {
namespace {

using matmul_internal::KernelSet;
using matmul_internal::RowSource;

std::atomic<SimdLevel>& LevelSlot() {
  static std::atomic<SimdLevel> level{DetectSimdLevel()};
  return level;
}

std::atomic<bool>& VnniSlot() {
  static std::atomic<bool> vnni{matmul_internal::CpuHasAvxVnni()};
  return vnni;
}

const KernelSet& Kernels() {
  switch (LevelSlot().load(std::memory_order_relaxed)) {
    case SimdLevel::kAvx512:
      return matmul_internal::Avx512Kernels();
    case SimdLevel::kAvx2:
      return matmul_internal::Avx2Kernels(VnniSlot().load(std::memory_order_relaxed));
    case SimdLevel::kPortable:
      break;
  }
  return matmul_internal::PortableKernels();
}

// Piece boundaries stay multiples of this so threads rarely end on a partial tile.
constexpr int64_t kRowGrain = 16;
// Element-wise passes (activation quantization, partial-sum reduction) at or above this size
// are split over the pool.
constexpr int64_t kParallelMinElems = 1 << 16;

// Weight bytes one row costs for n_tokens tokens: what the pool balances pieces by.
int64_t RowCost(const MatrixView& w, int64_t n_tokens) {
  return std::max<int64_t>(1, w.row_data_bytes() * std::max<int64_t>(1, n_tokens));
}

// Shares a sparse call over n_ids rows of w splits into, one per thread when there is enough
// work: each at least half of the parallel threshold and kRowGrain ids. Fixed by the sizes and
// the thread count (AxpyRows' rounding depends on it), never by timing.
int SparseShares(const MatrixView& w, int64_t n_ids, const ThreadPool& pool) {
  return static_cast<int>(std::max<int64_t>(
      1,
      std::min({int64_t{pool.size()}, n_ids * RowCost(w, 1) / (ThreadPool::kMinParallelBytes / 2),
                n_ids / kRowGrain})));
}

// Scratch owned by the calling thread: quantized activations and AxpyRows partial sums. Pool
// workers only read or write it inside a region that the owner is blocked in.
struct Scratch {
  std::array<std::vector<uint8_t>, kMaxMatMulMany> q8;  // one per input form MatMulMany prepares
  std::vector<float> partials;
};
Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// The activations as the kernels of w.type read them: x itself, or x prepared (quantized to
// Q8_0) once for all rows and threads (pool == nullptr: on this thread).
struct PreparedInput {
  const uint8_t* data;
  int64_t stride;  // bytes between tokens
};

PreparedInput PrepareInputInto(const matmul_internal::TypeKernels& tk, const MatrixView& w,
                               const float* x, int64_t n_tokens, int64_t x_stride, ThreadPool* pool,
                               std::vector<uint8_t>& q8) {
  if (tk.prepare_input == nullptr) {
    return {reinterpret_cast<const uint8_t*>(x), x_stride * static_cast<int64_t>(sizeof(float))};
  }
  // Rounded to whole cache lines so tokens prepared by different threads share none.
  const int64_t row_bytes = (tk.input_bytes(w.cols) + 63) / 64 * 64;
  if (q8.size() < static_cast<size_t>(row_bytes * n_tokens)) q8.resize(row_bytes * n_tokens);
  uint8_t* dst = q8.data();
  auto quantize = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      tk.prepare_input(x + t * x_stride, w.cols, dst + t * row_bytes);
    }
  };
  if (pool != nullptr && n_tokens > 1 && n_tokens * w.cols >= kParallelMinElems) {
    pool->ParallelFor(n_tokens, quantize);
  } else {
    quantize(0, n_tokens);
  }
  return {dst, row_bytes};
}

PreparedInput PrepareInput(const matmul_internal::TypeKernels& tk, const MatrixView& w,
                           const float* x, int64_t n_tokens, int64_t x_stride, ThreadPool* pool) {
  return PrepareInputInto(tk, w, x, n_tokens, x_stride, pool, ThreadScratch().q8[0]);
}

// The interleaved copy is used when there is one and the active family has its kernels.
const matmul_internal::TypeKernels* InterleavedKernels(const KernelSet& k, const MatrixView& w) {
  if (w.interleaved == nullptr || !k.HasInterleaved8(w.type)) return nullptr;
  return &k.interleaved8[static_cast<size_t>(w.type)];
}

// Rows [r0, r1) from the interleaved groups: whole groups straight into y, a group only partly
// in the range through a scratch tile (the rows a group computes are fixed, so its results do
// not depend on the range).
void InterleavedRows(const matmul_internal::TypeKernels& tk, const MatrixView& w,
                     const PreparedInput& in, int64_t n_tokens, float* y, int64_t y_stride,
                     int64_t r0, int64_t r1) {
  constexpr int64_t kG = kInterleaved8Rows;
  const int64_t group_bytes = Interleaved8GroupBytes(w.type, w.cols);
  auto groups = [&](int64_t g) { return RowSource{w.interleaved + g * group_bytes, group_bytes}; };
  const int64_t f0 = (r0 + kG - 1) / kG, f1 = r1 / kG;
  if (f0 < f1) {
    tk.dot(groups(f0), f1 - f0, w.cols, in.data, in.stride, n_tokens, y + f0 * kG, y_stride);
  }
  auto partial = [&](int64_t g) {
    std::vector<float> tile(kG * n_tokens);
    tk.dot(groups(g), 1, w.cols, in.data, in.stride, n_tokens, tile.data(), kG);
    const int64_t a = std::max(r0, g * kG), e = std::min(r1, (g + 1) * kG);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = a; r < e; ++r) y[t * y_stride + r] = tile[t * kG + r - g * kG];
    }
  };
  const int64_t first = r0 / kG, last = (r1 - 1) / kG;
  if (f0 >= f1) {
    partial(first);
    if (last != first) partial(last);
    return;
  }
  if (r0 % kG != 0) partial(first);
  if (r1 % kG != 0) partial(last);
}

}  // namespace

SimdLevel ActiveKernelSimdLevel() { return LevelSlot().load(std::memory_order_relaxed); }

bool ActiveKernelUsesVnni() {
  return ActiveKernelSimdLevel() == SimdLevel::kAvx2 && VnniSlot().load(std::memory_order_relaxed);
}

bool SetSimdLevelForTesting(SimdLevel level, bool vnni) {
  if (level > CpuSimdLevel()) return false;
  if (vnni && (level != SimdLevel::kAvx2 || !matmul_internal::CpuHasAvxVnni())) return false;
  LevelSlot().store(level, std::memory_order_relaxed);
  VnniSlot().store(vnni, std::memory_order_relaxed);
  return true;
}

namespace matmul_internal {

bool CpuHasAvx2() { return CpuSimdLevel() >= SimdLevel::kAvx2; }

bool CpuHasAvxVnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return CpuHasAvx2() && __builtin_cpu_supports("avxvnni");
#else
  return false;
#endif
}

}  // namespace matmul_internal

void MatMul(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
            int64_t y_stride, ThreadPool& pool) {
  if (w.rows <= 0 || n_tokens <= 0) return;
  const KernelSet& k = Kernels();
  if (const auto* tk = InterleavedKernels(k, w)) {
    const PreparedInput in = PrepareInput(*tk, w, x, n_tokens, x_stride, &pool);
    // kRowGrain is a multiple of kInterleaved8Rows: pieces start on group boundaries.
    static_assert(kRowGrain % kInterleaved8Rows == 0);
    pool.ParallelForBytes(
        w.rows, RowCost(w, n_tokens),
        [&](int64_t r0, int64_t r1) { InterleavedRows(*tk, w, in, n_tokens, y, y_stride, r0, r1); },
        kRowGrain);
    return;
  }
  const PreparedInput in = PrepareInput(k.For(w.type), w, x, n_tokens, x_stride, &pool);
  const auto dot = k.For(w.type).dot;
  pool.ParallelForBytes(
      w.rows, RowCost(w, n_tokens),
      [&](int64_t r0, int64_t r1) {
        dot(RowSource{w.row(r0), w.row_bytes, nullptr}, r1 - r0, w.cols, in.data, in.stride,
            n_tokens, y + r0, y_stride);
      },
      kRowGrain);
}

void MatMulMany(std::span<const MatMulOutput> outs, const float* x, int64_t n_tokens,
                int64_t x_stride, ThreadPool& pool) {
  if (outs.size() > kMaxMatMulMany) std::abort();  // a programming error (matmul.h)
  if (n_tokens <= 0) return;
  const KernelSet& k = Kernels();
  struct Part {
    const MatrixView* w;
    const matmul_internal::TypeKernels* tk;
    bool interleaved;
    PreparedInput in;
    int64_t begin;  // the part's first row in the region's row space
    float* y;
    int64_t y_stride;
  };
  std::array<Part, kMaxMatMulMany> parts;
  size_t n_parts = 0, n_prepared = 0;
  int64_t rows = 0, bytes = 0;
  for (const MatMulOutput& o : outs) {
    if (o.w->rows <= 0) continue;
    Part& p = parts[n_parts++];
    const auto* il = InterleavedKernels(k, *o.w);
    p = Part{o.w, il != nullptr ? il : &k.For(o.w->type), il != nullptr, {}, 0, o.y, o.y_stride};
    // An input form already prepared (same preparation, same width) is reused: that is the
    // point of the call.
    bool found = false;
    for (size_t j = 0; j + 1 < n_parts && !found; ++j) {
      const Part& q = parts[j];
      if (q.tk->prepare_input == p.tk->prepare_input && q.w->cols == o.w->cols) {
        p.in = q.in;
        found = true;
      }
    }
    if (!found) {
      p.in = PrepareInputInto(*p.tk, *o.w, x, n_tokens, x_stride, &pool,
                              ThreadScratch().q8[n_prepared++]);
    }
    // Every part starts on a grain boundary, so pieces start on interleaved groups' boundaries.
    p.begin = (rows + kRowGrain - 1) / kRowGrain * kRowGrain;
    rows = p.begin + o.w->rows;
    bytes += o.w->rows * RowCost(*o.w, n_tokens);
  }
  if (n_parts == 0) return;
  // Pieces are balanced by the parts' average row cost; the guided cut's short last pieces
  // absorb the difference where the parts' types differ.
  pool.ParallelForBytes(
      rows, std::max<int64_t>(1, bytes / rows),
      [&](int64_t r0, int64_t r1) {
        for (size_t i = 0; i < n_parts; ++i) {
          const Part& p = parts[i];
          const int64_t a = std::max(r0, p.begin) - p.begin;
          const int64_t e = std::min(r1, p.begin + p.w->rows) - p.begin;
          if (a >= e) continue;
          if (p.interleaved) {
            InterleavedRows(*p.tk, *p.w, p.in, n_tokens, p.y, p.y_stride, a, e);
          } else {
            p.tk->dot(RowSource{p.w->row(a), p.w->row_bytes, nullptr}, e - a, p.w->cols, p.in.data,
                      p.in.stride, n_tokens, p.y + a, p.y_stride);
          }
        }
      },
      kRowGrain);
}

void MatMulRows(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
                int64_t y_stride, int64_t row_begin, int64_t row_end) {
  if (row_end <= row_begin || n_tokens <= 0) return;
  const KernelSet& k = Kernels();
  if (const auto* tk = InterleavedKernels(k, w)) {
    const PreparedInput in = PrepareInput(*tk, w, x, n_tokens, x_stride, nullptr);
    InterleavedRows(*tk, w, in, n_tokens, y, y_stride, row_begin, row_end);
    return;
  }
  const PreparedInput in = PrepareInput(k.For(w.type), w, x, n_tokens, x_stride, nullptr);
  k.For(w.type).dot(RowSource{w.row(row_begin), w.row_bytes, nullptr}, row_end - row_begin, w.cols,
                    in.data, in.stride, n_tokens, y + row_begin, y_stride);
}

void DequantizeMatrixRow(const MatrixView& w, int64_t r, float* out) {
  if (w.cols <= 0) return;
  Kernels().For(w.type).dequantize(w.row(r), w.cols, out);
}

void GatherMatMul(const MatrixView& w, const int32_t* row_ids, int64_t n_ids, const float* x,
                  float* y, ThreadPool& pool) {
  if (n_ids <= 0) return;
  const KernelSet& k = Kernels();
  const PreparedInput in = PrepareInput(k.For(w.type), w, x, 1, w.cols, nullptr);
  const auto dot = k.For(w.type).dot;
  // One claimed share per thread, as AxpyRows: each piece starts its gathered rows cold (the
  // tile driver prefetches a piece's rows 32 KiB on, never its first 32 KiB), and the guided
  // pieces of ParallelForBytes, down to 16 KiB, left much of a gather unprefetched. Measured on
  // AMD Zen 5 (gemv_bench, 13% of 2048-column rows, two threads, two alternations): q4_0
  // 18.3 -> 22.5-23.2 GB/s, q8_0 25.0 -> 29.3-30.9, q4_K 16.5 -> 21.0-21.6 (the plain read of
  // the same rows: 28 / 31-33 / 28). Which thread computes a row changes none of its bits.
  const int nth = SparseShares(w, n_ids, pool);
  auto share = [&](int64_t i0, int64_t i1) {
    dot(RowSource{w.data, w.row_bytes, row_ids + i0}, i1 - i0, w.cols, in.data, in.stride, 1,
        y + i0, 0);
  };
  if (nth <= 1) {
    share(0, n_ids);
    return;
  }
  pool.ForEachPiece(nth, [&](int, int64_t s) { share(n_ids * s / nth, n_ids * (s + 1) / nth); });
}

bool HasIntAxpy(GgmlType type) { return Kernels().HasIntAxpy(type); }

void IntAxpyRows(const MatrixView& w, const int32_t* row_ids, const float* coeffs, int64_t n_ids,
                 float* y) {
  if (n_ids <= 0) return;
  const KernelSet& k = Kernels();
  // Callers check HasIntAxpy; another type here is a programming error.
  if (!k.HasIntAxpy(w.type)) std::abort();
  k.int_axpy[static_cast<size_t>(w.type)](RowSource{w.data, w.row_bytes, row_ids}, coeffs, n_ids,
                                          w.cols, y);
}

void AxpyRows(const MatrixView& w, const int32_t* row_ids, const float* coeffs, int64_t n_ids,
              float* y, ThreadPool& pool) {
  if (n_ids <= 0) return;
  const auto axpy = Kernels().For(w.type).axpy;
  // One share per thread when there is enough work, so the sum's rounding is fixed too.
  const int nth = SparseShares(w, n_ids, pool);
  if (nth <= 1) {
    axpy(RowSource{w.data, w.row_bytes, row_ids}, coeffs, n_ids, w.cols, y);
    return;
  }
  // Share 0 adds straight into y, the others into private partial sums that are added to y
  // afterwards, in share order, so the result depends only on the thread count. Shares are
  // claimed: whichever thread runs one, a thread the machine does not schedule holds up none.
  std::vector<float>& partials = ThreadScratch().partials;
  const int64_t cols = w.cols;
  if (partials.size() < static_cast<size_t>((nth - 1) * cols)) partials.resize((nth - 1) * cols);
  float* part = partials.data();
  pool.ForEachPiece(nth, [&](int, int64_t s) {
    const int64_t i0 = n_ids * s / nth, i1 = n_ids * (s + 1) / nth;
    float* acc = y;
    if (s > 0) {
      acc = part + (s - 1) * cols;
      std::fill(acc, acc + cols, 0.0f);
    }
    axpy(RowSource{w.data, w.row_bytes, row_ids + i0}, coeffs + i0, i1 - i0, cols, acc);
  });
  auto reduce = [&](int64_t c0, int64_t c1) {
    for (int j = 0; j < nth - 1; ++j) {
      const float* p = part + j * cols;
      for (int64_t c = c0; c < c1; ++c) y[c] += p[c];
    }
  };
  if ((nth - 1) * cols >= kParallelMinElems) {
    pool.ParallelFor(cols, reduce, 64);
  } else {
    reduce(0, cols);
  }
}

}  // namespace thermocline
