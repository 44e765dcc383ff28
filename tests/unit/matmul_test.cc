#include "shared/kernels/matmul.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/interleaved8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/dispatch.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/cpu_features.h"
#include "shared/util/fp16.h"
#include "shared/util/thread_pool.h"
#include "tests/kernel_families.h"

namespace thermocline {

namespace {

// What each weight type's kernels do to the activations (matmul_kernels.h): round them to
// Q8_0 or Q8_K as llama.cpp does, or keep them f32.
GgmlType ActivationType(GgmlType t) {
  switch (t) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kIQ4_NL:
      return GgmlType::kQ8_0;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
      return GgmlType::kQ8_K;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return GgmlType::kQ8_1;
    default:
      return GgmlType::kF32;
  }
}
bool IsQuant(GgmlType t) { return ActivationType(t) != GgmlType::kF32; }

// Types whose weights are d * sc * q - dmin * m: the offset of dmin's fp16 after d's.
bool HasMin(GgmlType t) {
  return t == GgmlType::kQ4_K || t == GgmlType::kQ5_K || t == GgmlType::kQ2_K;
}

int64_t BlockSize(GgmlType t) { return TypeTraits(t).block_size; }
int64_t RoundUp(int64_t n, GgmlType t) {
  return (n + BlockSize(t) - 1) / BlockSize(t) * BlockSize(t);
}

using testing::HalfOffsets;
using testing::RandomBlocks;

// A random matrix quantized with the reference QuantizeRow, plus its dequantized values: the
// exact operands the kernels multiply.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // rows x cols
  // |d * sc * q| + |dmin * m| per element (|deq| for types without mins): the magnitudes the
  // integer kernels' two f32 terms per block carry, which cancel in deq.
  std::vector<float> parts;
  MatrixView view;
};

// One row dequantized with the fp16 at HalfOffsets(type)[which] zeroed in every block: for the
// types with mins, which = 1 leaves the d * sc * q term alone and which = 0 the min term, each
// exactly (a product of exact small factors).
void DequantizeWithout(GgmlType type, const uint8_t* row, int64_t cols, int which, float* out) {
  const GgmlTypeTraits& t = TypeTraits(type);
  std::vector<uint8_t> copy(row, row + RowBytes(type, cols));
  for (int64_t b = 0; b < cols / t.block_size; ++b) {
    std::memset(copy.data() + b * t.block_bytes + HalfOffsets(type)[which], 0, 2);
  }
  DequantizeRow(type, copy.data(), out, cols);
}

void AbsParts(GgmlType type, const uint8_t* row, int64_t cols, float* parts) {
  if (!HasMin(type)) {
    DequantizeRow(type, row, parts, cols);
    for (int64_t c = 0; c < cols; ++c) parts[c] = std::fabs(parts[c]);
    return;
  }
  std::vector<float> term(cols);
  std::fill(parts, parts + cols, 0.0f);
  for (int which = 0; which < 2; ++which) {
    DequantizeWithout(type, row, cols, which, term.data());
    for (int64_t c = 0; c < cols; ++c) parts[c] += std::fabs(term[c]);
  }
}

TestMatrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestMatrix m;
  const int64_t rb = RowBytes(type, cols);
  // One spare byte in front puts every row at an odd address, as in a GGUF file with alignment 1.
  m.bytes.assign(rows * rb + 1, 0);
  m.deq.resize(rows * cols);
  m.parts.resize(rows * cols);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(-3.0f, 3.0f);
  std::vector<float> src(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = std::exp(scale(rng));  // rows of very different magnitude
    for (int64_t c = 0; c < cols; ++c) src[c] = normal(rng) * s;
    // An all-zero block exercises the d = 0 path of the quantized formats.
    const bool zero_block = r % 7 == 3;
    if (zero_block) std::fill(src.begin(), src.begin() + std::min<int64_t>(cols, kQK), 0.0f);
    uint8_t* row = m.bytes.data() + 1 + r * rb;
    if (HasQuantizer(type)) {
      QuantizeRow(type, src.data(), row, cols);
    } else {
      RandomBlocks(type, cols, s / 64, rng, row);
      if (zero_block) std::fill(row, row + TypeTraits(type).block_bytes, 0);
    }
    DequantizeRow(type, m.bytes.data() + 1 + r * rb, m.deq.data() + r * cols, cols);
    AbsParts(type, m.bytes.data() + 1 + r * rb, cols, m.parts.data() + r * cols);
  }
  m.view = MatrixView{type, rows, cols, m.bytes.data() + 1, rb};
  return m;
}

// What the kernels see of the activations: Q8_0-, Q8_K- or Q8_1-rounded for quantized weights;
// for Q8_1 also each block's s (fp16 of d * sum q, as stored), into *sums.
std::vector<float> EffectiveInput(GgmlType type, const float* x, int64_t cols,
                                  std::vector<float>* sums = nullptr) {
  std::vector<float> out(x, x + cols);
  const GgmlType a = ActivationType(type);
  if (a == GgmlType::kQ8_1) {
    std::vector<uint8_t> q(cols / kQK * kQ8_1BlockBytes);
    QuantizeRowQ8_1(x, q.data(), cols);
    if (sums != nullptr) sums->resize(cols / kQK);
    for (int64_t b = 0; b < cols / kQK; ++b) {
      const uint8_t* blk = q.data() + b * kQ8_1BlockBytes;
      uint16_t d, sh;
      std::memcpy(&d, blk, 2);
      std::memcpy(&sh, blk + 2, 2);
      if (sums != nullptr) (*sums)[b] = Fp16ToFp32(sh);
      for (int j = 0; j < kQK; ++j) {
        out[b * kQK + j] = Fp16ToFp32(d) * static_cast<float>(static_cast<int8_t>(blk[4 + j]));
      }
    }
  } else if (a != GgmlType::kF32) {
    std::vector<uint8_t> q(RowBytes(a, cols));
    if (a == GgmlType::kQ8_K) {
      QuantizeRowQ8_K(x, q.data(), cols);
    } else {
      QuantizeRow(a, x, q.data(), cols);
    }
    DequantizeRow(a, q.data(), out.data(), cols);
  }
  return out;
}

// Tolerance. The reference sums the exact same operands in double, so the whole difference is
// the kernels' f32 rounding: each product is exact (FMA) or rounded once, and n terms summed
// in f32 in any order are off by at most about (n - 1) * u * sum|w_i x_i| (u = 2^-24, the
// classic recursive-summation bound, which lane-split and pairwise orders only improve). For
// quantized types each block sum is an exact integer (< 2^24, so exact as f32 too); the scale
// product d_w * d_x and its multiply add two roundings per block. (n + 4) * FLT_EPSILON
// (= 2u per term) covers both with a factor of two to spare, and is a worst-case bound, so
// the check cannot flake. It is kept tight enough to mean something by using moderate n: with
// n <= 2048, n * eps * sum|w x| is below one average term |w x|, so a dropped or doubled
// element is caught.
double Tolerance(int64_t n, double sum_abs) {
  return (static_cast<double>(n) + 4.0) * FLT_EPSILON * sum_abs + 1e-30;
}

// Tolerance for Q8_K activations. Each super-block b contributes (d * xd) * I_b and, with mins,
// -(dmin * xd) * M_b, I_b and M_b exact integers; the exact value of their sum over b is the
// sum of w_c x_c over the exact weights w = d*sc*q - dmin*m and activations x = xd * q8. The
// reference's operands are f32 roundings of those (deq: at most one rounding of d*sc*q - dmin*m,
// u relative to |d*sc*q| + |dmin*m|; the activation d * q8: u), 2u * P in all, where
// P = sum_c (|d*sc*q_c| + |dmin*m_c|) |x_c| (TestMatrix::parts times |x|). The kernels, per term:
// int32 -> f32 (u), d * xd (u), the product or FMA into the running sum (u); the running sum
// over at most 2 * nb terms per lane (nb blocks; AVX2 gives each of its 8 lanes one term per
// block) and a final reduction of 8 lanes: (2 nb + 3) u * P. The terms are bounded by P (each
// |I_b| and |M_b| term by the parts of its block), so in all (2 nb + 8) u P, i.e.
// (nb + 4) * FLT_EPSILON * P; twice that leaves room for second-order terms. For cols <= 2048
// (nb <= 8) that is 24 * 1.2e-7 * P, far below one element's share of P: a dropped, doubled or
// misplaced element is caught.
double Q8KTolerance(int64_t cols, double parts_abs) {
  return 2.0 * (static_cast<double>(cols / kQK_K) + 4.0) * FLT_EPSILON * parts_abs + 1e-30;
}
// Q8_1 (q4_1, q5_1): per block of 32, (d_w * d_x) * I + m_w * s_x with I exact (< 2^17) and s_x
// the fp16 the activation block stores, which the reference uses as is (ggml's arithmetic: s_x
// is not the sum of the dequantized activations). The reference's other operands are exact
// (d_w * q: fp16 times 5 bits; d_x * q8: fp16 times 8 bits), so the whole difference is the
// kernels' f32 rounding, counted as for Q8_K over nb = cols / 32 blocks with
// P = sum |d_w q_c x_c| + sum_b |m_b s_b|.
double Q8_1Tolerance(int64_t cols, double parts_abs) {
  return 2.0 * (static_cast<double>(cols / kQK) + 4.0) * FLT_EPSILON * parts_abs + 1e-30;
}

class KernelTest : public testing::KernelFamilyTest {};

std::string TypeName(GgmlType t) { return std::string(TypeTraits(t).name); }

TEST_P(KernelTest, MatMulMatchesDoubleReference) {
  struct Shape {
    int64_t rows, cols;
  };
  // Rows not a multiple of any tile (1, 5, 13, 67), the smallest quantized row (32), a ragged
  // float row (37, 1001: not a multiple of 8), and one matrix large enough to span several
  // L2-sized row blocks when many tokens are batched (300 x 2048).
  const Shape shapes[] = {{1, 32}, {5, 37}, {13, 96}, {67, 1001}, {300, 2048}};
  std::mt19937 rng(1234);
  for (GgmlType type : testing::kWeightTypes) {
    for (const Shape& s : shapes) {
      const int64_t cols = RoundUp(s.cols, type);
      TestMatrix m = MakeMatrix(type, s.rows, cols, rng);
      for (int64_t n_tokens : {1, 3, 17}) {
        if (s.rows >= 300 && n_tokens > 3) continue;  // keep the reference cheap
        const int64_t x_stride = cols + 3, y_stride = s.rows + 2;
        std::vector<float> x = testing::NormalVector(n_tokens * x_stride, rng);
        std::vector<double> ref(n_tokens * s.rows), bound(n_tokens * s.rows);
        const bool q8_1 = ActivationType(type) == GgmlType::kQ8_1;
        std::vector<float> d_part;  // q8_1: the d_w * q term of each weight, without m
        if (q8_1) {
          d_part.resize(s.rows * cols);
          for (int64_t r = 0; r < s.rows; ++r) {
            DequantizeWithout(type, m.view.row(r), cols, 1, d_part.data() + r * cols);
          }
        }
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::vector<float> sums;
          const std::vector<float> xe = EffectiveInput(type, x.data() + t * x_stride, cols, &sums);
          for (int64_t r = 0; r < s.rows && q8_1; ++r) {
            double sum = 0, sum_abs = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double p = static_cast<double>(d_part[r * cols + c]) * xe[c];
              sum += p;
              sum_abs += std::fabs(p);
            }
            for (int64_t b = 0; b < cols / kQK; ++b) {
              uint16_t mh;
              std::memcpy(&mh, m.view.row(r) + b * TypeTraits(type).block_bytes + 2, 2);
              const double p = static_cast<double>(Fp16ToFp32(mh)) * sums[b];
              sum += p;
              sum_abs += std::fabs(p);
            }
            ref[t * s.rows + r] = sum;
            bound[t * s.rows + r] = Q8_1Tolerance(cols, sum_abs);
          }
          for (int64_t r = 0; r < s.rows && !q8_1; ++r) {
            double sum = 0, sum_abs = 0, parts_abs = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double p = static_cast<double>(m.deq[r * cols + c]) * xe[c];
              sum += p;
              sum_abs += std::fabs(p);
              parts_abs += static_cast<double>(m.parts[r * cols + c]) * std::fabs(xe[c]);
            }
            ref[t * s.rows + r] = sum;
            bound[t * s.rows + r] = ActivationType(type) == GgmlType::kQ8_K
                                        ? Q8KTolerance(cols, parts_abs)
                                        : Tolerance(cols, sum_abs);
          }
        }
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          std::vector<float> y(n_tokens * y_stride, -7.0f);
          MatMul(m.view, x.data(), n_tokens, x_stride, y.data(), y_stride, pool);
          for (int64_t t = 0; t < n_tokens; ++t) {
            for (int64_t r = 0; r < s.rows; ++r) {
              ASSERT_NEAR(y[t * y_stride + r], ref[t * s.rows + r], bound[t * s.rows + r])
                  << TypeName(type) << " " << s.rows << "x" << cols << " tokens=" << n_tokens
                  << " threads=" << threads << " t=" << t << " r=" << r;
            }
            for (int64_t r = s.rows; r < y_stride; ++r) {
              ASSERT_EQ(y[t * y_stride + r], -7.0f) << "wrote past the rows";
            }
          }
        }
      }
    }
  }
}

// Batching tokens and splitting rows over threads must not change any bit: every output is one
// dot product computed by one thread with the same operation sequence (see matmul_kernels.h).
TEST_P(KernelTest, BatchThreadsAndRowSplitsAreBitIdentical) {
  std::mt19937 rng(99);
  for (GgmlType type : testing::kWeightTypes) {
    // Rows enough that every type's product is above the pool's single-thread threshold
    // (ThreadPool::kMinParallelBytes), so that 2 and 3 threads do split it.
    const int64_t rows = 301, cols = BlockSize(type) > 1 ? RoundUp(300, type) : 300, n_tokens = 17;
    TestMatrix m = MakeMatrix(type, rows, cols, rng);
    ASSERT_GE(m.view.row_bytes * n_tokens * rows, ThreadPool::kMinParallelBytes) << TypeName(type);
    std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
    ThreadPool pool1(1);
    std::vector<float> batched(n_tokens * rows);
    MatMul(m.view, x.data(), n_tokens, cols, batched.data(), rows, pool1);
    std::vector<float> single(rows);
    for (int64_t t = 0; t < n_tokens; ++t) {
      MatMul(m.view, x.data() + t * cols, 1, cols, single.data(), rows, pool1);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(batched[t * rows + r], single[r]) << TypeName(type) << " t=" << t << " r=" << r;
      }
    }
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> y(n_tokens * rows);
      MatMul(m.view, x.data(), n_tokens, cols, y.data(), rows, pool);
      EXPECT_EQ(std::memcmp(y.data(), batched.data(), y.size() * sizeof(float)), 0)
          << TypeName(type) << " threads=" << threads;
    }
    std::vector<float> y(n_tokens * rows);
    for (int64_t r0 = 0; r0 < rows; r0 += 10) {
      MatMulRows(m.view, x.data(), n_tokens, cols, y.data(), rows, r0, std::min(rows, r0 + 10));
    }
    EXPECT_EQ(std::memcmp(y.data(), batched.data(), y.size() * sizeof(float)), 0)
        << TypeName(type) << " MatMulRows";
  }
}

// MatMulMany is one MatMul per output, bit for bit: the same dot products, with the input
// prepared once per form and all rows in one region. Groups mix the input forms (f32, Q8_0,
// Q8_1, Q8_K), repeat a form (shared preparation), include an empty matrix and interleaved
// copies; row counts that are not multiples of the region's grain put parts' boundaries inside
// pieces.
TEST_P(KernelTest, MatMulManyEqualsOneMatMulPerOutput) {
  std::mt19937 rng(2024);
  const std::vector<std::vector<GgmlType>> groups = {
      {GgmlType::kQ4_0, GgmlType::kQ4_0, GgmlType::kQ4_0},
      {GgmlType::kQ4_K, GgmlType::kQ4_K, GgmlType::kQ6_K},
      {GgmlType::kF16, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ4_1},
      {GgmlType::kQ8_0, GgmlType::kF32, GgmlType::kBF16},
  };
  // Wide enough that every group is above the pool's single-thread threshold, so that 2 and 3
  // threads do split it.
  const int64_t cols = 2048;
  for (const std::vector<GgmlType>& types : groups) {
    for (bool interleave : {false, true}) {
      std::vector<TestMatrix> mats;
      std::vector<std::vector<uint8_t>> copies;
      const int64_t rows[] = {301, 37, 130, 64};
      for (size_t i = 0; i < types.size(); ++i) {
        mats.push_back(MakeMatrix(types[i], rows[i], cols, rng));
      }
      for (TestMatrix& m : mats) {
        if (!interleave || !HasInterleaved8Layout(m.view.type)) continue;
        copies.emplace_back(Interleaved8Bytes(m.view.type, m.view.rows, cols));
        Interleave8(m.view.type, m.view.data, m.view.row_bytes, m.view.rows, cols,
                    copies.back().data());
        m.view.interleaved = copies.back().data();
      }
      int64_t bytes = 0;
      for (const TestMatrix& m : mats) bytes += m.view.rows * m.view.row_bytes;
      ASSERT_GE(bytes, ThreadPool::kMinParallelBytes);
      // An empty matrix among them is skipped.
      const MatrixView empty{GgmlType::kQ4_0, 0, cols, nullptr, RowBytes(GgmlType::kQ4_0, cols)};
      for (int64_t n_tokens : {1, 5}) {
        std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
        std::vector<std::vector<float>> want(mats.size());
        ThreadPool pool1(1);
        for (size_t i = 0; i < mats.size(); ++i) {
          want[i].resize(n_tokens * mats[i].view.rows);
          MatMul(mats[i].view, x.data(), n_tokens, cols, want[i].data(), mats[i].view.rows, pool1);
        }
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          std::vector<std::vector<float>> got(mats.size());
          std::vector<MatMulOutput> outs;
          for (size_t i = 0; i < mats.size(); ++i) {
            got[i].assign(n_tokens * mats[i].view.rows, -1.0f);
            outs.push_back({&mats[i].view, got[i].data(), mats[i].view.rows});
            if (i == 0 && mats.size() < kMaxMatMulMany) outs.push_back({&empty, nullptr, 0});
          }
          MatMulMany(outs, x.data(), n_tokens, cols, pool);
          for (size_t i = 0; i < mats.size(); ++i) {
            EXPECT_TRUE(testing::SameBits(got[i], want[i]))
                << TypeName(types[i]) << " (output " << i << ") interleaved=" << interleave
                << " tokens=" << n_tokens << " threads=" << threads;
          }
        }
      }
    }
  }
}

// A float row's ragged end (cols not a multiple of 8) must add exactly what the same row padded
// with zero columns adds: its columns in the step's first lanes, zeros in the others. The avx2
// and avx512 families handle the end differently (in-place loads moved into those lanes, masked
// loads) and agree bit for bit only through this shared rule.
TEST_P(KernelTest, RaggedFloatEndEqualsZeroPaddedColumns) {
  std::mt19937 rng(31);
  ThreadPool pool(1);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    for (int64_t cols : {3, 9, 13, 15, 257, 2043}) {
      const int64_t rows = 37, padded = (cols + 7) / 8 * 8;
      TestMatrix m = MakeMatrix(type, rows, cols, rng);
      const int64_t rb = m.view.row_bytes, prb = RowBytes(type, padded);
      std::vector<uint8_t> pbytes(rows * prb, 0);  // 0 bytes are +0 in all three types
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(pbytes.data() + r * prb, m.view.data + r * rb, rb);
      }
      const MatrixView pview{type, rows, padded, pbytes.data(), prb};
      for (int64_t n_tokens : {1, 5}) {
        std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
        std::vector<float> px(n_tokens * padded, 0.0f);
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::copy_n(x.data() + t * cols, cols, px.data() + t * padded);
        }
        std::vector<float> y(n_tokens * rows), py(n_tokens * rows);
        MatMul(m.view, x.data(), n_tokens, cols, y.data(), rows, pool);
        MatMul(pview, px.data(), n_tokens, padded, py.data(), rows, pool);
        EXPECT_TRUE(testing::SameBits(y, py))
            << TypeName(type) << " cols=" << cols << " tokens=" << n_tokens;
      }
    }
  }
}

TEST_P(KernelTest, GatherMatMulEqualsDenseRows) {
  std::mt19937 rng(7);
  for (GgmlType type : testing::kWeightTypes) {
    const int64_t rows = 500, cols = BlockSize(type) > 1 ? 2048 : 2043;
    TestMatrix m = MakeMatrix(type, rows, cols, rng);
    std::vector<float> x = testing::NormalVector(cols, rng);
    ThreadPool pool1(1);
    std::vector<float> dense(rows);
    MatMul(m.view, x.data(), 1, cols, dense.data(), rows, pool1);
    // Empty, one, unsorted with repeats, short lists that do not fill a tile, and every row.
    std::uniform_int_distribution<int32_t> pick(0, rows - 1);
    for (int64_t n_ids : {0, 1, 3, 9, 301, 500}) {
      std::vector<int32_t> ids(n_ids);
      for (int32_t& id : ids) id = pick(rng);
      if (n_ids == rows) {
        for (int64_t i = 0; i < n_ids; ++i) ids[i] = static_cast<int32_t>(i);
      }
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> y(n_ids + 1, -7.0f);
        GatherMatMul(m.view, ids.data(), n_ids, x.data(), y.data(), pool);
        for (int64_t i = 0; i < n_ids; ++i) {
          // Same kernel, same operation order per dot product: equal bits, not just close.
          ASSERT_EQ(y[i], dense[ids[i]]) << TypeName(type) << " n_ids=" << n_ids << " i=" << i;
        }
        EXPECT_EQ(y[n_ids], -7.0f);
      }
    }
  }
}

TEST_P(KernelTest, AxpyRowsMatchesDoubleReference) {
  std::mt19937 rng(5);
  struct Case {
    int64_t rows, cols, n_ids;
  };
  // Empty and one-row lists, small lists (one thread, ragged float rows), a long one that every
  // pool size splits, and every row in order.
  const Case cases[] = {{10, 43, 0}, {10, 43, 1},      {10, 43, 5},
                        {50, 96, 7}, {400, 2048, 300}, {64, 512, 64}};
  for (GgmlType type : testing::kWeightTypes) {
    for (const Case& k : cases) {
      const int64_t cols = RoundUp(k.cols, type);
      TestMatrix m = MakeMatrix(type, k.rows, cols, rng);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(k.rows) - 1);
      std::vector<int32_t> ids(k.n_ids);
      for (int32_t& id : ids) id = pick(rng);
      if (k.n_ids == k.rows) {
        for (int64_t i = 0; i < k.n_ids; ++i) ids[i] = static_cast<int32_t>(i);
      }
      const std::vector<float> coeffs = testing::NormalVector(k.n_ids, rng);
      const std::vector<float> y0 = testing::NormalVector(cols, rng);
      std::vector<double> ref(cols), sum_abs(cols);
      for (int64_t c = 0; c < cols; ++c) {
        ref[c] = y0[c];
        sum_abs[c] = std::fabs(y0[c]);
      }
      for (int64_t i = 0; i < k.n_ids; ++i) {
        for (int64_t c = 0; c < cols; ++c) {
          const double p = static_cast<double>(coeffs[i]) * m.deq[ids[i] * cols + c];
          ref[c] += p;
          sum_abs[c] += std::fabs(p);
        }
      }
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> y = y0;
        y.push_back(-7.0f);
        AxpyRows(m.view, ids.data(), coeffs.data(), k.n_ids, y.data(), pool);
        for (int64_t c = 0; c < cols; ++c) {
          // n_ids + 1 terms per column; for quantized rows coeff * d adds one rounding.
          ASSERT_NEAR(y[c], ref[c], Tolerance(k.n_ids + 1, sum_abs[c]))
              << TypeName(type) << " " << k.rows << "x" << cols << " n_ids=" << k.n_ids
              << " threads=" << threads << " c=" << c;
        }
        EXPECT_EQ(y[cols], -7.0f);
      }
    }
  }
}

// AxpyRows at the edges of its row and column loops, for every type: no ids, one, every row in
// order, counts that fill no whole group of rows, shuffled and repeated ids; rows of one block,
// two, three, seven and 4096 + 32 columns (plus 3 for the float types, a ragged end); random
// coefficients, zeros mixed with negatives, and huge ones (1e30: the products stay finite);
// 1-3 threads. Against the double sum over the dequantized rows, within the bound of
// AxpyRowsMatchesDoubleReference. And on one thread bit for bit the same as one call per id in
// the same order: TypeKernels::axpy adds the rows in order into each output, whichever rows it
// shares a pass over y with.
TEST_P(KernelTest, AxpyRowsEdgeCases) {
  std::mt19937 rng(23);
  constexpr int64_t kRows = 70;
  const int64_t widths[] = {32, 64, 96, 224, 4096 + 32};
  for (GgmlType type : testing::kWeightTypes) {
    std::vector<int64_t> done;  // the K-quants round several widths up to one block
    for (int64_t width : widths) {
      const int64_t cols = BlockSize(type) > 1 ? RoundUp(width, type) : width + 3;
      if (std::find(done.begin(), done.end(), cols) != done.end()) continue;
      done.push_back(cols);
      TestMatrix m = MakeMatrix(type, kRows, cols, rng);
      std::vector<std::vector<int32_t>> id_sets = {{}, {5}};
      id_sets.emplace_back(kRows);
      for (int64_t i = 0; i < kRows; ++i) id_sets.back()[i] = static_cast<int32_t>(i);
      std::vector<int32_t> shuffled = id_sets.back();
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      id_sets.emplace_back(shuffled.begin(), shuffled.begin() + 17);
      id_sets.emplace_back(shuffled.begin(), shuffled.begin() + 9);
      std::uniform_int_distribution<int32_t> pick(0, kRows - 1);
      for (int64_t n : {33, 240}) {  // with repeats; 240 rows are split by 2 and 3 threads
        id_sets.emplace_back(n);
        for (int32_t& id : id_sets.back()) id = pick(rng);
      }
      for (const std::vector<int32_t>& ids : id_sets) {
        const int64_t n_ids = static_cast<int64_t>(ids.size());
        for (int pattern = 0; pattern < 3; ++pattern) {
          std::vector<float> coeffs = testing::NormalVector(n_ids, rng);
          for (int64_t i = 0; i < n_ids; ++i) {
            if (pattern == 1) coeffs[i] = i % 3 == 0 ? 0.0f : -std::fabs(coeffs[i]);
            if (pattern == 2) coeffs[i] = coeffs[i] < 0 ? -1e30f : 1e30f;
          }
          const std::vector<float> y0 = testing::NormalVector(cols, rng);
          std::vector<double> ref(y0.begin(), y0.end()), sum_abs(cols);
          for (int64_t c = 0; c < cols; ++c) sum_abs[c] = std::fabs(y0[c]);
          for (int64_t i = 0; i < n_ids; ++i) {
            for (int64_t c = 0; c < cols; ++c) {
              const double p = static_cast<double>(coeffs[i]) * m.deq[ids[i] * cols + c];
              ref[c] += p;
              sum_abs[c] += std::fabs(p);
            }
          }
          ThreadPool pool1(1);
          std::vector<float> one_by_one = y0;
          for (int64_t i = 0; i < n_ids; ++i) {
            AxpyRows(m.view, ids.data() + i, coeffs.data() + i, 1, one_by_one.data(), pool1);
          }
          for (int threads : {1, 2, 3}) {
            ThreadPool pool(threads);
            std::vector<float> y = y0;
            y.push_back(-7.0f);
            AxpyRows(m.view, ids.data(), coeffs.data(), n_ids, y.data(), pool);
            for (int64_t c = 0; c < cols; ++c) {
              ASSERT_NEAR(y[c], ref[c], Tolerance(n_ids + 1, sum_abs[c]))
                  << TypeName(type) << " cols=" << cols << " n_ids=" << n_ids
                  << " pattern=" << pattern << " threads=" << threads << " c=" << c;
            }
            ASSERT_EQ(y[cols], -7.0f) << "wrote past the row";
            if (threads == 1) {
              ASSERT_EQ(std::memcmp(y.data(), one_by_one.data(), cols * sizeof(float)), 0)
                  << TypeName(type) << " cols=" << cols << " n_ids=" << n_ids
                  << " pattern=" << pattern << ": not the rows added one by one";
            }
          }
        }
      }
    }
  }
}

TEST_P(KernelTest, DequantizeMatrixRowMatchesReference) {
  std::mt19937 rng(3);
  for (GgmlType type : testing::kWeightTypes) {
    const int64_t cols = RoundUp(64, type) * 2;
    TestMatrix m = MakeMatrix(type, 8, cols, rng);
    std::vector<float> row(cols);
    for (int64_t r = 0; r < 8; ++r) {
      DequantizeMatrixRow(m.view, r, row.data());
      EXPECT_EQ(std::memcmp(row.data(), m.deq.data() + r * cols, cols * sizeof(float)), 0)
          << TypeName(type) << " row " << r;
    }
  }
}

// AxpyRows decodes every block type but q8_0 / q4_0 to its dequantized values and adds them
// exactly as the f32 kernel does (matmul_kernels.h): the same bits as AxpyRows of the same
// family over the dequantized matrix.
TEST_P(KernelTest, BlockTypeAxpyEqualsF32KernelOnDequantizedMatrix) {
  std::mt19937 rng(17);
  for (GgmlType type : testing::kWeightTypes) {
    if (BlockSize(type) == 1 || type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0) continue;
    const int64_t rows = 29, cols = RoundUp(512, type), n_tokens = 5;
    EXPECT_TRUE(IsQuant(type)) << TypeName(type) << " has 8-bit activations";
    TestMatrix m = MakeMatrix(type, rows, cols, rng);
    MatrixView f32{GgmlType::kF32, rows, cols, reinterpret_cast<const uint8_t*>(m.deq.data()),
                   cols * static_cast<int64_t>(sizeof(float))};
    std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
    ThreadPool pool(1);
    std::vector<int32_t> ids = {3, 0, 28, 3, 17, 9, 11};
    std::vector<float> ya(cols, 0.5f), yb(cols, 0.5f);
    AxpyRows(m.view, ids.data(), x.data(), 7, ya.data(), pool);
    AxpyRows(f32, ids.data(), x.data(), 7, yb.data(), pool);
    EXPECT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)), 0) << TypeName(type);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, KernelTest, ::testing::ValuesIn(testing::kKernelFamilies),
                         testing::KernelFamilyName);

// AVX-VNNI only changes how the exact integer block sums are formed (see matmul_avx2.cc), so
// both AVX2 variants must agree bit for bit.
TEST(VnniTest, SameBitsAsPlainAvx2) {
  if (!matmul_internal::CpuHasAvxVnni()) GTEST_SKIP() << "no AVX-VNNI";
  std::mt19937 rng(21);
  const matmul_internal::KernelSet& plain = matmul_internal::Avx2Kernels(false);
  const matmul_internal::KernelSet& vnni = matmul_internal::Avx2Kernels(true);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kIQ4_NL,
                        GgmlType::kQ4_1, GgmlType::kQ5_1}) {
    const int64_t rows = 37, cols = 640, n_tokens = 5;
    TestMatrix m = MakeMatrix(type, rows, cols, rng);
    std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
    const int64_t in_bytes = plain.For(type).input_bytes(cols);
    ASSERT_EQ(in_bytes, vnni.For(type).input_bytes(cols));
    std::vector<uint8_t> in_plain(n_tokens * in_bytes), in_vnni(n_tokens * in_bytes);
    for (int64_t t = 0; t < n_tokens; ++t) {
      plain.For(type).prepare_input(x.data() + t * cols, cols, in_plain.data() + t * in_bytes);
      vnni.For(type).prepare_input(x.data() + t * cols, cols, in_vnni.data() + t * in_bytes);
    }
    std::vector<float> y_plain(n_tokens * rows), y_vnni(n_tokens * rows);
    const matmul_internal::RowSource src{m.view.data, m.view.row_bytes, nullptr};
    plain.For(type).dot(src, rows, cols, in_plain.data(), in_bytes, n_tokens, y_plain.data(), rows);
    vnni.For(type).dot(src, rows, cols, in_vnni.data(), in_bytes, n_tokens, y_vnni.data(), rows);
    EXPECT_EQ(std::memcmp(y_plain.data(), y_vnni.data(), y_plain.size() * sizeof(float)), 0)
        << TypeName(type);
  }
}

// The kernel table of every family covers exactly the weight types, and exactly the types with
// 8-bit activations prepare (quantize) them.
TEST(KernelTableTest, EveryFamilyCoversExactlyTheWeightTypes) {
  std::vector<const matmul_internal::KernelSet*> sets = {&matmul_internal::PortableKernels()};
  if (matmul_internal::CpuHasAvx2()) {
    sets.push_back(&matmul_internal::Avx2Kernels(false));
    sets.push_back(&matmul_internal::Avx2Kernels(true));
  }
  for (const matmul_internal::KernelSet* k : sets) {
    for (uint32_t id = 0; id < matmul_internal::kTypeSlots; ++id) {
      const auto t = TypeTraits(id);
      const bool weight = t.has_value() && IsWeightType(t->type);
      const GgmlType type = static_cast<GgmlType>(id);
      EXPECT_EQ(k->Has(type), weight) << k->name << " type id " << id;
      if (!weight) continue;
      const matmul_internal::TypeKernels& tk = k->For(type);
      EXPECT_TRUE(tk.axpy != nullptr && tk.dequantize != nullptr) << k->name << " " << id;
      EXPECT_EQ(tk.prepare_input != nullptr, IsQuant(type)) << k->name << " " << id;
      EXPECT_EQ(tk.input_bytes != nullptr, IsQuant(type)) << k->name << " " << id;
    }
  }
  int n = 0;
  for (GgmlType t : testing::kWeightTypes) n += IsWeightType(t);
  EXPECT_EQ(n, static_cast<int>(std::size(testing::kWeightTypes)));
}

// QuantizeRowQ8_K against ggml's definition computed independently here: d = max / -127 for
// the first value of largest magnitude, q = round-half-even(x * (-127 / max)) capped at 127
// (std::nearbyint in the default rounding mode), bsums of 16; and every family's Q8_K
// prepare_input bytes equal to it, for every type that uses Q8_K activations.
TEST(ActivationQuantizeTest, Q8KMatchesGgmlDefinitionInEveryFamily) {
  std::mt19937 rng(12);
  const int64_t n = kQK_K * 8;
  std::vector<float> x = testing::NormalVector(n, rng);
  // Block 1: max -127, so iscale = 1 and the other values are exact .5 ties of both signs.
  for (int j = 0; j < kQK_K; ++j) {
    x[kQK_K + j] = j == 0 ? -127.0f : (j % 2 ? 1.0f : -1.0f) * static_cast<float>(j % 120 + 0.5);
  }
  std::fill(x.begin() + 2 * kQK_K, x.begin() + 3 * kQK_K, 0.0f);  // d = 0
  x[3 * kQK_K + 17] = 1e-30f;                                     // tiny scale
  x[4 * kQK_K + 5] = 3.0f;                                        // +amax and -amax: first wins
  x[4 * kQK_K + 9] = -3.0f;
  for (int j = 0; j < kQK_K; ++j) x[5 * kQK_K + j] = 6.5e4f * static_cast<float>(j % 3 - 1);
  std::vector<uint8_t> want(n / kQK_K * kQ8KBlockBytes);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* xb = x.data() + b * kQK_K;
    uint8_t* blk = want.data() + b * kQ8KBlockBytes;
    float amax = 0, max = 0;
    for (int j = 0; j < kQK_K; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float iscale = amax != 0 ? -127.0f / max : 0.0f;
    const float d = amax != 0 ? 1.0f / iscale : 0.0f;
    std::memcpy(blk, &d, 4);
    int8_t q[kQK_K];
    for (int j = 0; j < kQK_K; ++j) {
      q[j] = static_cast<int8_t>(std::min(127.0f, std::nearbyint(xb[j] * iscale)));
    }
    std::memcpy(blk + 4, q, kQK_K);
    for (int g = 0; g < 16; ++g) {
      int16_t sum = 0;
      for (int k = 0; k < 16; ++k) sum = static_cast<int16_t>(sum + q[16 * g + k]);
      std::memcpy(blk + 4 + kQK_K + 2 * g, &sum, 2);
    }
  }
  std::vector<uint8_t> got(want.size(), 0xCD);
  QuantizeRowQ8_K(x.data(), got.data(), n);
  for (size_t b = 0; b < want.size(); b += kQ8KBlockBytes) {
    ASSERT_EQ(std::memcmp(got.data() + b, want.data() + b, kQ8KBlockBytes), 0)
        << "QuantizeRowQ8_K block " << b / kQ8KBlockBytes;
  }
  std::vector<const matmul_internal::KernelSet*> sets = {&matmul_internal::PortableKernels()};
  if (matmul_internal::CpuHasAvx2()) {
    sets.push_back(&matmul_internal::Avx2Kernels(false));
    sets.push_back(&matmul_internal::Avx2Kernels(true));
  }
  int checked = 0;
  for (const matmul_internal::KernelSet* k : sets) {
    for (GgmlType type : testing::kWeightTypes) {
      if (ActivationType(type) != GgmlType::kQ8_K) continue;
      const matmul_internal::TypeKernels& tk = k->For(type);
      ASSERT_EQ(tk.input_bytes(n), static_cast<int64_t>(want.size())) << k->name;
      std::vector<uint8_t> prepared(want.size(), 0xCD);
      tk.prepare_input(x.data(), n, prepared.data());
      for (size_t b = 0; b < want.size(); b += kQ8KBlockBytes) {
        ASSERT_EQ(std::memcmp(prepared.data() + b, want.data() + b, kQ8KBlockBytes), 0)
            << k->name << " " << TypeName(type) << " block " << b / kQ8KBlockBytes;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// QuantizeRowQ8_1 against ggml's quantize_row_q8_1_ref restated: d and qs exactly those of the
// Q8_0 reference, s = fp16(sum of qs * amax / 127); the portable family's prepare_input writes
// it as is (the AVX2 families keep s in their own layout, checked through MatMul above).
TEST(ActivationQuantizeTest, Q8_1MatchesGgmlDefinition) {
  std::mt19937 rng(13);
  const int64_t n = 32 * 64;
  std::vector<float> x = testing::NormalVector(n, rng);
  for (int j = 0; j < 32; ++j) x[32 + j] = (j == 0) ? 127.0f : (j % 2 ? 1.0f : -1.0f) * (j + 0.5f);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
  for (int j = 128; j < 160; ++j) x[j] = 6.5e4f * (j % 3 - 1);
  std::vector<uint8_t> q8_0(RowBytes(GgmlType::kQ8_0, n));
  QuantizeRow(GgmlType::kQ8_0, x.data(), q8_0.data(), n);
  std::vector<uint8_t> got(n / kQK * kQ8_1BlockBytes, 0xCD);
  QuantizeRowQ8_1(x.data(), got.data(), n);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const uint8_t* g = got.data() + b * kQ8_1BlockBytes;
    const uint8_t* w = q8_0.data() + b * sizeof(BlockQ8_0);
    ASSERT_EQ(std::memcmp(g, w, 2), 0) << "d of block " << b;
    ASSERT_EQ(std::memcmp(g + 4, w + 2, kQK), 0) << "qs of block " << b;
    float amax = 0;
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      amax = std::max(amax, std::fabs(x[b * kQK + j]));
      sum += static_cast<int8_t>(w[2 + j]);
    }
    const uint16_t s = Fp32ToFp16(static_cast<float>(sum) * (amax / 127));
    ASSERT_EQ(std::memcmp(g + 2, &s, 2), 0) << "s of block " << b;
  }
  const matmul_internal::TypeKernels& tk = matmul_internal::PortableKernels().For(GgmlType::kQ4_1);
  ASSERT_EQ(tk.input_bytes(n), static_cast<int64_t>(got.size()));
  std::vector<uint8_t> prepared(got.size());
  tk.prepare_input(x.data(), n, prepared.data());
  EXPECT_EQ(prepared, got);
}

// The activation quantizer of every kernel family must reproduce ggml's reference rounding
// (roundf: ties away from zero) bit for bit, or quantized results would drift from llama.cpp's.
TEST(ActivationQuantizeTest, EveryLevelMatchesQuantizeRow) {
  std::mt19937 rng(11);
  const int64_t n = 32 * 64;
  std::vector<float> x = testing::NormalVector(n, rng);
  // Block 1 has amax 127, so d = 1 and x * id = x: exact .5 ties in both signs.
  for (int j = 0; j < 32; ++j) x[32 + j] = (j == 0) ? 127.0f : (j % 2 ? 1.0f : -1.0f) * (j + 0.5f);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);              // d = 0
  x[96] = 1e-30f;                                               // subnormal-range scale
  for (int j = 128; j < 160; ++j) x[j] = 6.5e4f * (j % 3 - 1);  // large values
  std::vector<uint8_t> want(RowBytes(GgmlType::kQ8_0, n));
  QuantizeRow(GgmlType::kQ8_0, x.data(), want.data(), n);
  std::vector<const matmul_internal::KernelSet*> sets = {&matmul_internal::PortableKernels()};
  if (matmul_internal::CpuHasAvx2()) sets.push_back(&matmul_internal::Avx2Kernels(false));
  for (const matmul_internal::KernelSet* k : sets) {
    std::vector<uint8_t> got(want.size(), 0xCD);
    k->quantize_q8_0(x.data(), got.data(), n);
    for (size_t b = 0; b < want.size(); b += sizeof(BlockQ8_0)) {
      ASSERT_EQ(std::memcmp(got.data() + b, want.data() + b, sizeof(BlockQ8_0)), 0)
          << k->name << " block " << b / sizeof(BlockQ8_0);
    }
  }
}

}  // namespace
}  // namespace thermocline
