// Q4_0 in the 8-row interleaved layout (shared/gguf/q4_0x8.h): the copy holds the same bytes,
// MatMul over it matches a double-precision reference and the row-layout kernel within bounds
// derived below, its two families agree bit for bit, and its results do not depend on threads,
// token batching or row ranges. The sparse paths keep reading the row layout.
//
// The bounds. Both layouts multiply the same operands: Q4_0 weights against Q8_0-rounded
// activations (ggml's rounding), each 32-element block an exact integer sum I (|I| <= 32 * 8 *
// 127 < 2^24, so exact in f32 too) scaled by s = fl(d_w * d_x). The interleaved kernel adds the
// nb = cols / 32 terms s_b * I_b to one f32 accumulator with one FMA each: |y - S| <= nb * u *
// sum_b |s_b I_b| (u = 2^-24, first order), S the exact sum. Against the exact product of the
// dequantized operands, sum_c w_c x_c, the rounding of s adds u * sum_b |s_b I_b|, and
// sum_b |s_b I_b| <= (1 + u) * P with P = sum_c |w_c x_c|: tolerance (nb + 2) * u * P, written
// (nb + 2) / 2 * FLT_EPSILON * P. The row kernel keeps 8 lanes of partial sums per row (nb FMAs
// each) and adds them in a 3-level tree: |y_row - S| <= (nb + 3) * u * P, so the layouts differ
// by at most (2 nb + 5) * u * P. A dropped or doubled block moves y by one |s_b I_b| ~ P / nb,
// orders of magnitude above these bounds for every shape tested (nb <= 129).
#include "shared/gguf/q4_0x8.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/dispatch.h"
#include "shared/kernels/matmul.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/cpu_features.h"
#include "shared/util/thread_pool.h"
#include "tests/kernel_families.h"

namespace thermocline {
namespace {

constexpr int64_t kRows[] = {1, 7, 8, 9, 33};
constexpr int64_t kCols[] = {32, 64, 4096 + 32};

struct Q4Matrix {
  std::vector<uint8_t> rows;         // file layout
  std::vector<uint8_t> interleaved;  // q4_0x8 layout
  std::vector<float> deq;            // [rows][cols]
  MatrixView view;                   // row layout only
  MatrixView packed;                 // the same with the interleaved copy
};

Q4Matrix MakeMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Q4Matrix m;
  const int64_t row_bytes = RowBytes(GgmlType::kQ4_0, cols);
  std::vector<float> f(cols);
  m.rows.resize(rows * row_bytes);
  m.deq.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    // Rows of different magnitudes, so that a row mix-up cannot hide inside the tolerance.
    const float scale = 0.5f + static_cast<float>(r % 5);
    for (float& v : f) v = scale * dist(rng);
    QuantizeRow(GgmlType::kQ4_0, f.data(), m.rows.data() + r * row_bytes, cols);
    DequantizeRow(GgmlType::kQ4_0, m.rows.data() + r * row_bytes, m.deq.data() + r * cols, cols);
  }
  m.interleaved.resize(Q4_0x8Groups(rows) * Q4_0x8GroupBytes(cols));
  InterleaveQ4_0x8(m.rows.data(), row_bytes, rows, cols, m.interleaved.data());
  m.view = MatrixView{GgmlType::kQ4_0, rows, cols, m.rows.data(), row_bytes};
  m.packed = m.view;
  m.packed.interleaved = m.interleaved.data();
  return m;
}

std::vector<float> Activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}


TEST(Q4_0x8LayoutTest, EveryRowComesBackByteForByte) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      const Q4Matrix m = MakeMatrix(rows, cols, static_cast<uint32_t>(rows * 131 + cols));
      const int64_t row_bytes = m.view.row_bytes;
      std::vector<uint8_t> row(row_bytes);
      std::vector<float> deq(cols);
      for (int64_t r = 0; r < rows; ++r) {
        ExtractQ4_0x8Row(m.interleaved.data(), cols, r, row.data());
        ASSERT_EQ(std::memcmp(row.data(), m.rows.data() + r * row_bytes, row_bytes), 0)
            << rows << "x" << cols << " row " << r;
        DequantizeRow(GgmlType::kQ4_0, row.data(), deq.data(), cols);
        ASSERT_EQ(std::memcmp(deq.data(), m.deq.data() + r * cols, cols * sizeof(float)), 0);
      }
      // The padding rows of the last group are zero (scale 0: they contribute nothing).
      for (int64_t r = rows; r < Q4_0x8Groups(rows) * kQ4_0x8Rows; ++r) {
        ExtractQ4_0x8Row(m.interleaved.data(), cols, r, row.data());
        for (uint8_t b : row) ASSERT_EQ(b, 0) << "padding row " << r;
      }
    }
  }
}

class Q4_0x8KernelTest : public testing::KernelFamilyTest {};

TEST_P(Q4_0x8KernelTest, MatchesDoubleReferenceAndRowLayout) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      const Q4Matrix m = MakeMatrix(rows, cols, static_cast<uint32_t>(rows * 7 + cols));
      // 35 tokens: two 16-token AMX tiles (q4_0x8_amx.cc, where the CPU has AMX) and a tail.
      for (const int64_t n_tokens : {3, 35}) {
        const std::vector<float> x = Activations(n_tokens * cols, static_cast<uint32_t>(cols));
        const std::vector<float> y = testing::MultiplyOnPool(m.packed, x, n_tokens, 2);
        const std::vector<float> y_rows = testing::MultiplyOnPool(m.view, x, n_tokens, 2);
        const double nb = static_cast<double>(cols / kQK);
        for (int64_t t = 0; t < n_tokens; ++t) {
          const std::vector<float> xq = testing::Q8Rounded(x.data() + t * cols, cols);
          for (int64_t r = 0; r < rows; ++r) {
            double ref = 0, p = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double term = static_cast<double>(m.deq[r * cols + c]) * xq[c];
              ref += term;
              p += std::fabs(term);
            }
            const float got = y[t * rows + r];
            EXPECT_LE(std::fabs(got - ref), (nb + 2) / 2 * FLT_EPSILON * p + 1e-30)
                << rows << "x" << cols << " row " << r << " token " << t;
            EXPECT_LE(std::fabs(static_cast<double>(got) - y_rows[t * rows + r]),
                      (2 * nb + 5) / 2 * FLT_EPSILON * p + 1e-30)
                << rows << "x" << cols << " row " << r << " token " << t << " vs row layout";
          }
        }
      }
    }
  }
}

TEST_P(Q4_0x8KernelTest, ThreadsBatchesAndRangesAreBitIdentical) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      const Q4Matrix m = MakeMatrix(rows, cols, static_cast<uint32_t>(rows + cols));
      // A full 4-token tile and a partial one; two 16-token AMX tiles and a partial one.
      for (const int64_t n_tokens : {6, 35}) {
        const std::vector<float> x = Activations(n_tokens * cols, 5);
        const std::vector<float> base = testing::MultiplyOnPool(m.packed, x, n_tokens, 1);
        for (int threads : {2, 3}) {
          EXPECT_TRUE(
              testing::SameBits(testing::MultiplyOnPool(m.packed, x, n_tokens, threads), base))
              << rows << "x" << cols << " threads " << threads;
        }
        for (int64_t t = 0; t < n_tokens; ++t) {
          const std::vector<float> one(x.begin() + t * cols, x.begin() + (t + 1) * cols);
          const std::vector<float> y1 = testing::MultiplyOnPool(m.packed, one, 1, 1);
          EXPECT_EQ(std::memcmp(y1.data(), base.data() + t * rows, rows * sizeof(float)), 0)
              << rows << "x" << cols << " token " << t << " alone";
        }
        // Ranges that start and end inside groups.
        for (int64_t r0 = 0; r0 < rows; r0 += 3) {
          for (int64_t r1 = r0 + 1; r1 <= rows; r1 += 5) {
            std::vector<float> y(n_tokens * rows, -1.0f);
            MatMulRows(m.packed, x.data(), n_tokens, cols, y.data(), rows, r0, r1);
            for (int64_t t = 0; t < n_tokens; ++t) {
              for (int64_t r = 0; r < rows; ++r) {
                const float want = r >= r0 && r < r1 ? base[t * rows + r] : -1.0f;
                ASSERT_EQ(std::memcmp(&y[t * rows + r], &want, sizeof want), 0)
                    << rows << "x" << cols << " [" << r0 << ", " << r1 << ") row " << r;
              }
            }
          }
        }
      }
    }
  }
}

// The sparse products never see the interleaved copy: they equal the row layout's exactly.
TEST_P(Q4_0x8KernelTest, GatherAndAxpyKeepTheRowLayout) {
  const Q4Matrix m = MakeMatrix(33, 64, 9);
  const std::vector<float> x = Activations(64, 10);
  ThreadPool pool(2);
  const std::vector<int32_t> ids = {32, 0, 7, 8, 9, 31, 16};
  std::vector<float> a(ids.size()), b(ids.size());
  GatherMatMul(m.packed, ids.data(), static_cast<int64_t>(ids.size()), x.data(), a.data(), pool);
  GatherMatMul(m.view, ids.data(), static_cast<int64_t>(ids.size()), x.data(), b.data(), pool);
  EXPECT_TRUE(testing::SameBits(a, b));
  const std::vector<float> rows_y = testing::MultiplyOnPool(m.view, x, 1, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a[i], &rows_y[ids[i]], sizeof(float)), 0) << "id " << ids[i];
  }
  std::vector<float> ya(64, 0.25f), yb(64, 0.25f);
  AxpyRows(m.packed, ids.data(), x.data(), static_cast<int64_t>(ids.size()), ya.data(), pool);
  AxpyRows(m.view, ids.data(), x.data(), static_cast<int64_t>(ids.size()), yb.data(), pool);
  EXPECT_TRUE(testing::SameBits(ya, yb));
  // A sub-range of rows drops the copy (a group may straddle it) and computes from rows.
  const MatrixView sub = m.packed.RowRange(3, 20);
  EXPECT_EQ(sub.interleaved, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Families, Q4_0x8KernelTest, ::testing::ValuesIn(testing::kKernelFamilies),
                         testing::KernelFamilyName);

// Same operations in the same order (legacy_x8.cc, legacy_x8_avx2.cc, legacy_x8_avx512.cc): the
// same bits.
TEST(Q4_0x8FamiliesTest, PortableAvx2AndAvx512AgreeBitForBit) {
  if (!matmul_internal::CpuHasAvx2()) GTEST_SKIP() << "no AVX2";
  const SimdLevel saved = ActiveKernelSimdLevel();
  const bool saved_vnni = ActiveKernelUsesVnni();
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      const Q4Matrix m = MakeMatrix(rows, cols, static_cast<uint32_t>(3 * rows + cols));
      const std::vector<float> x = Activations(5 * cols, 11);
      ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kPortable));
      const std::vector<float> portable = testing::MultiplyOnPool(m.packed, x, 5, 2);
      ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kAvx2));
      const std::vector<float> avx2 = testing::MultiplyOnPool(m.packed, x, 5, 2);
      EXPECT_TRUE(testing::SameBits(portable, avx2)) << rows << "x" << cols;
      if (SetSimdLevelForTesting(SimdLevel::kAvx512)) {
        const std::vector<float> avx512 = testing::MultiplyOnPool(m.packed, x, 5, 2);
        EXPECT_TRUE(testing::SameBits(avx2, avx512)) << rows << "x" << cols << " avx512";
      }
    }
  }
  SetSimdLevelForTesting(saved, saved_vnni);
}

}  // namespace
}  // namespace thermocline
