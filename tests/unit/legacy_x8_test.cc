// Q4_0, Q5_0 and Q8_0 in their 8-row interleaved layouts (shared/gguf/legacy_x8.h): the copy
// holds the same bytes, MatMul over it matches a double-precision reference and the row-layout
// kernels within q4_0x8_test.cc's bounds (derived there for Q4_0; they hold unchanged here: the
// block sums are exact int32 below 2^24 in f32, |I| <= 32 * 128 * 127 for Q8_0, and each
// layout adds the same terms in the same way as for Q4_0), every family gives the same bits,
// and results do not depend on threads or token batching (1-30 tokens, odd group counts).
#include "shared/gguf/legacy_x8.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/interleaved8.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/dispatch.h"
#include "shared/kernels/matmul.h"
#include "shared/util/thread_pool.h"
#include "tests/kernel_families.h"

namespace thermocline {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ8_0};
// Group counts 1, 2, 5, 7, 8 and 14 (odd ones leave AVX-512's pairing a group alone; a one-token
// product takes groups four at a time, leaving 1, 3 or 2), partial groups.
constexpr int64_t kRows[] = {1, 7, 9, 33, 55, 61, 111};
// One block, two, the 1.3B-like ffn_down width's 86 and an odd 129.
constexpr int64_t kCols[] = {32, 64, 2752, 4096 + 32};
constexpr int64_t kMaxTokens = 30;

std::string Name(GgmlType type, int64_t rows, int64_t cols) {
  return std::string(TypeTraits(type).name) + " " + std::to_string(rows) + "x" +
         std::to_string(cols);
}

using Matrix = testing::InterleavedMatrix;

// Quantized N(0, scale) rows of different magnitudes (a row mix-up cannot hide inside the
// tolerance), or with `random_bytes` every bit pattern of the quants.
Matrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed,
                  bool random_bytes = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Matrix m;
  const int64_t row_bytes = RowBytes(type, cols);
  std::vector<float> f(cols);
  m.rows.resize(rows * row_bytes);
  m.deq.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.rows.data() + r * row_bytes;
    if (random_bytes) {
      testing::RandomBlocks(type, cols, 1.0f / 64, rng, row);
    } else {
      const float scale = 0.5f + static_cast<float>(r % 5);
      for (float& v : f) v = scale * dist(rng);
      QuantizeRow(type, f.data(), row, cols);
    }
    DequantizeRow(type, row, m.deq.data() + r * cols, cols);
  }
  testing::AddInterleavedCopy(type, rows, cols, m);
  return m;
}

TEST(LegacyX8LayoutTest, EveryRowComesBackByteForByte) {
  for (GgmlType type : kTypes) {
    EXPECT_TRUE(HasInterleaved8Layout(type));
    for (int64_t rows : kRows) {
      for (int64_t cols : kCols) {
        const Matrix m = MakeMatrix(type, rows, cols, static_cast<uint32_t>(rows * 131 + cols),
                                    /*random_bytes=*/true);
        const int64_t row_bytes = m.view.row_bytes;
        // The copy is the rows' bytes in another order: no extra space per row.
        EXPECT_EQ(Interleaved8GroupBytes(type, cols), kLegacyX8Rows * row_bytes);
        std::vector<uint8_t> row(row_bytes);
        for (int64_t r = 0; r < rows; ++r) {
          ExtractInterleaved8Row(type, m.interleaved.data(), cols, r, row.data());
          ASSERT_EQ(std::memcmp(row.data(), m.rows.data() + r * row_bytes, row_bytes), 0)
              << Name(type, rows, cols) << " row " << r;
        }
        // The padding rows of the last group are zero (scale 0: they contribute nothing).
        for (int64_t r = rows; r < LegacyX8Groups(rows) * kLegacyX8Rows; ++r) {
          ExtractInterleaved8Row(type, m.interleaved.data(), cols, r, row.data());
          for (uint8_t b : row) ASSERT_EQ(b, 0) << Name(type, rows, cols) << " padding row " << r;
        }
      }
    }
  }
}

class LegacyX8KernelTest : public testing::KernelFamilyTest {};

// 1 to 30 tokens on 1 to 3 threads, against the double reference and the row layout; each
// token count's results are the first tokens' of the 30-token product, bit for bit.
TEST_P(LegacyX8KernelTest, MatchesDoubleReferenceAtEveryTokenCount) {
  for (GgmlType type : kTypes) {
    for (int64_t rows : kRows) {
      for (int64_t cols : kCols) {
        const Matrix m = MakeMatrix(type, rows, cols, static_cast<uint32_t>(rows * 7 + cols));
        std::mt19937 rng(static_cast<uint32_t>(cols));
        const std::vector<float> x = testing::NormalVector(kMaxTokens * cols, rng);
        std::vector<double> ref(kMaxTokens * rows), p(kMaxTokens * rows);
        for (int64_t t = 0; t < kMaxTokens; ++t) {
          const std::vector<float> xq = testing::Q8Rounded(x.data() + t * cols, cols);
          for (int64_t r = 0; r < rows; ++r) {
            double sum = 0, abs_sum = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double term = static_cast<double>(m.deq[r * cols + c]) * xq[c];
              sum += term;
              abs_sum += std::fabs(term);
            }
            ref[t * rows + r] = sum;
            p[t * rows + r] = abs_sum;
          }
        }
        const std::vector<float> all = testing::MultiplyOnPool(m.packed, x, kMaxTokens, 2);
        const std::vector<float> all_rows = testing::MultiplyOnPool(m.view, x, kMaxTokens, 2);
        const double nb = static_cast<double>(cols / kQK);
        for (int64_t i = 0; i < kMaxTokens * rows; ++i) {
          EXPECT_LE(std::fabs(all[i] - ref[i]), (nb + 2) / 2 * FLT_EPSILON * p[i] + 1e-30)
              << Name(type, rows, cols) << " row " << i % rows << " token " << i / rows;
          EXPECT_LE(std::fabs(static_cast<double>(all[i]) - all_rows[i]),
                    (2 * nb + 5) / 2 * FLT_EPSILON * p[i] + 1e-30)
              << Name(type, rows, cols) << " row " << i % rows << " token " << i / rows
              << " vs row layout";
        }
        for (int64_t n = 1; n < kMaxTokens; ++n) {
          const std::vector<float> xn(x.begin(), x.begin() + n * cols);
          const int threads = 1 + static_cast<int>(n % 3);
          const std::vector<float> y = testing::MultiplyOnPool(m.packed, xn, n, threads);
          ASSERT_EQ(std::memcmp(y.data(), all.data(), y.size() * sizeof(float)), 0)
              << Name(type, rows, cols) << " tokens " << n << " threads " << threads;
        }
      }
    }
  }
}

// The sparse products never see the interleaved copy: they equal the row layout's exactly.
TEST_P(LegacyX8KernelTest, GatherAndAxpyKeepTheRowLayout) {
  for (GgmlType type : kTypes) {
    const Matrix m = MakeMatrix(type, 33, 64, 9);
    std::mt19937 rng(10);
    const std::vector<float> x = testing::NormalVector(64, rng);
    ThreadPool pool(2);
    const std::vector<int32_t> ids = {32, 0, 7, 8, 9, 31, 16};
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<float> a(n), b(n);
    GatherMatMul(m.packed, ids.data(), n, x.data(), a.data(), pool);
    GatherMatMul(m.view, ids.data(), n, x.data(), b.data(), pool);
    EXPECT_TRUE(testing::SameBits(a, b)) << TypeTraits(type).name;
    std::vector<float> ya(64, 0.25f), yb(64, 0.25f);
    AxpyRows(m.packed, ids.data(), x.data(), n, ya.data(), pool);
    AxpyRows(m.view, ids.data(), x.data(), n, yb.data(), pool);
    EXPECT_TRUE(testing::SameBits(ya, yb)) << TypeTraits(type).name;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, LegacyX8KernelTest,
                         ::testing::ValuesIn(testing::kKernelFamilies), testing::KernelFamilyName);

// Same operations in the same order (legacy_x8.cc, legacy_x8_avx2.cc, legacy_x8_avx512.cc): the
// same bits in every family this CPU runs, on every bit pattern of the quants (Q8_0's -128 too,
// which the interleaved kernels handle: see legacy_x8_avx2.cc).
TEST(LegacyX8FamiliesTest, EveryFamilyGivesThePortableBits) {
  const SimdLevel saved = ActiveKernelSimdLevel();
  const bool saved_vnni = ActiveKernelUsesVnni();
  for (GgmlType type : kTypes) {
    for (int64_t rows : kRows) {
      for (int64_t cols : kCols) {
        const Matrix m = MakeMatrix(type, rows, cols, static_cast<uint32_t>(3 * rows + cols),
                                    /*random_bytes=*/true);
        std::mt19937 rng(11);
        for (int64_t n_tokens : {1, 4, 5, 8, 17, 35}) {  // 17, 35: AMX tiles where the CPU has them
          const std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
          ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kPortable));
          const std::vector<float> portable = testing::MultiplyOnPool(m.packed, x, n_tokens, 2);
          for (const testing::KernelFamily& f : testing::kKernelFamilies) {
            if (!SetSimdLevelForTesting(f.level, f.vnni)) continue;
            EXPECT_TRUE(
                testing::SameBits(testing::MultiplyOnPool(m.packed, x, n_tokens, 2), portable))
                << Name(type, rows, cols) << " tokens " << n_tokens << " " << f.name;
          }
        }
      }
    }
  }
  SetSimdLevelForTesting(saved, saved_vnni);
}

}  // namespace
}  // namespace thermocline
