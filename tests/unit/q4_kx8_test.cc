// Q4_K in the 8-row interleaved layout (shared/gguf/q4_kx8.h): the copy gives every row back
// byte for byte, MatMul over it matches a double-precision reference and the row-layout kernel
// within bounds derived below, its two families agree bit for bit, and its results do not depend
// on threads, token batching or row ranges. The sparse paths keep reading the row layout.
//
// The bounds. Both layouts multiply the same operands: Q4_K weights against Q8_K-rounded
// activations (QuantizeRowQ8_K). Per row and 256-column super-block the sums I = sum_s sc_s *
// sum_{l in s} q_l xq_l and M = sum_s mn_s * sum_{l in s} xq_l are exact int32, and the block's
// value is d xd I - dmin xd M. The interleaved kernel adds the 2 nb terms (nb = cols / 256) with
// one FMA each into one f32 accumulator after rounding fl(d * xd) and fl(I) (|I| may pass 2^24):
// |y - S| <= (2 nb + 2) u P to first order (u = 2^-24), S the exact sum, P = sum of the terms'
// magnitudes <= sum_c (|d sc q xd xq_c| + |dmin mn xd xq_c|), which the test computes per
// element. Written with FLT_EPSILON = 2u and room for second order: (nb + 2) FLT_EPSILON P.
// The AVX2 row kernel keeps 8 lanes per row (each an exact partial I or M below 2^24, 2 nb FMAs
// after the rounding of fl(d * xd)) and adds them in a 3-level tree: (2 nb + 4) u P; the
// portable row kernel rounds fl(d xd), fl(I), the product and the sum: (2 nb + 3) u P. So the
// layouts differ by at most (4 nb + 6) u P, tested as (2 nb + 4) FLT_EPSILON P. A sub-block's
// scale or min taken from the wrong row or sub-block moves y by about P / (8 nb), orders of
// magnitude above these bounds for every shape tested (nb <= 17).
#include "shared/gguf/q4_kx8.h"

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
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/cpu_features.h"
#include "shared/util/fp16.h"
#include "shared/util/thread_pool.h"

namespace thermocline {
namespace {

constexpr int64_t kRows[] = {1, 7, 8, 9, 33};
constexpr int64_t kCols[] = {256, 512, 4096 + 256};

struct Q4KMatrix {
  std::vector<uint8_t> rows;         // file layout
  std::vector<uint8_t> interleaved;  // q4_kx8 layout
  MatrixView view;                   // row layout only
  MatrixView packed;                 // the same with the interleaved copy
};

// Rows quantized by ggml's reference Q4_K quantizer, or (random_bytes) arbitrary bytes, which
// exercise every bit of the 6-bit scale packing.
Q4KMatrix MakeMatrix(int64_t rows, int64_t cols, uint32_t seed, bool random_bytes = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Q4KMatrix m;
  const int64_t row_bytes = RowBytes(GgmlType::kQ4_K, cols);
  std::vector<float> f(cols);
  m.rows.resize(rows * row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.rows.data() + r * row_bytes;
    if (random_bytes) {
      for (int64_t i = 0; i < row_bytes; ++i) row[i] = static_cast<uint8_t>(rng());
      continue;
    }
    // Rows of different magnitudes, so that a row mix-up cannot hide inside the tolerance; a
    // mean offset gives the mins work to do.
    const float scale = 0.5f + static_cast<float>(r % 5);
    for (float& v : f) v = scale * (dist(rng) + 0.3f);
    QuantizeRow(GgmlType::kQ4_K, f.data(), row, cols);
  }
  m.interleaved.resize(Q4_Kx8Groups(rows) * Q4_Kx8GroupBytes(cols));
  InterleaveQ4_Kx8(m.rows.data(), row_bytes, rows, cols, m.interleaved.data());
  m.view = MatrixView{GgmlType::kQ4_K, rows, cols, m.rows.data(), row_bytes};
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

// The exact product of one Q4_K row with the Q8_K-rounded activations, in double (every term
// d * sc * q * xd * xq is exact in double), and P, the sum of the terms' magnitudes.
void Reference(const uint8_t* row, const uint8_t* q8k, int64_t cols, double* ref, double* p) {
  *ref = 0;
  *p = 0;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const uint8_t* w = row + b * 144;
    const uint8_t* x = q8k + b * kQ8KBlockBytes;
    uint16_t dh, mh;
    std::memcpy(&dh, w, 2);
    std::memcpy(&mh, w + 2, 2);
    float xd;
    std::memcpy(&xd, x, 4);
    const double d = Fp16ToFp32(dh), dmin = Fp16ToFp32(mh);
    const int8_t* xq = reinterpret_cast<const int8_t*>(x + 4);
    for (int e = 0; e < kQK_K; ++e) {
      int sc, mn;
      Q4KScaleMin(w + 4, e / 32, &sc, &mn);
      const uint8_t v = w[16 + 32 * (e / 64) + e % 32];
      const int q = (e / 32) % 2 ? v >> 4 : v & 0x0F;
      const double a = d * sc * q * xd * xq[e], c = dmin * mn * xd * xq[e];
      *ref += a - c;
      *p += std::fabs(a) + std::fabs(c);
    }
  }
}

std::vector<float> Multiply(const MatrixView& w, const std::vector<float>& x, int64_t n_tokens,
                            int threads) {
  ThreadPool pool(threads);
  std::vector<float> y(n_tokens * w.rows, -1.0f);
  MatMul(w, x.data(), n_tokens, w.cols, y.data(), w.rows, pool);
  return y;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Q4_Kx8LayoutTest, EveryRowComesBackByteForByte) {
  for (bool random_bytes : {false, true}) {
    for (int64_t rows : kRows) {
      for (int64_t cols : kCols) {
        const Q4KMatrix m =
            MakeMatrix(rows, cols, static_cast<uint32_t>(rows * 131 + cols), random_bytes);
        const int64_t row_bytes = m.view.row_bytes;
        std::vector<uint8_t> row(row_bytes);
        for (int64_t r = 0; r < rows; ++r) {
          ExtractQ4_Kx8Row(m.interleaved.data(), cols, r, row.data());
          ASSERT_EQ(std::memcmp(row.data(), m.rows.data() + r * row_bytes, row_bytes), 0)
              << rows << "x" << cols << " row " << r << (random_bytes ? " (random bytes)" : "");
          // The same through the by-type entry points the model and the kernels use.
          ExtractInterleaved8Row(GgmlType::kQ4_K, m.interleaved.data(), cols, r, row.data());
          ASSERT_EQ(std::memcmp(row.data(), m.rows.data() + r * row_bytes, row_bytes), 0);
        }
        // The padding rows of the last group are zero (d = dmin = 0: they contribute nothing).
        for (int64_t r = rows; r < Q4_Kx8Groups(rows) * kQ4_Kx8Rows; ++r) {
          ExtractQ4_Kx8Row(m.interleaved.data(), cols, r, row.data());
          for (uint8_t b : row) ASSERT_EQ(b, 0) << "padding row " << r;
        }
        EXPECT_EQ(Interleaved8Bytes(GgmlType::kQ4_K, rows, cols),
                  static_cast<int64_t>(m.interleaved.size()));
      }
    }
  }
  // 148 bytes per row and super-block (scales and mins unpacked to bytes) against 144.
  EXPECT_EQ(Q4_Kx8GroupBytes(256), 8 * 148);
}

struct Family {
  SimdLevel level;
  bool vnni;
  const char* name;
};
constexpr Family kFamilies[] = {{SimdLevel::kPortable, false, "portable"},
                                {SimdLevel::kAvx2, false, "avx2"},
                                {SimdLevel::kAvx2, true, "avx2_vnni"}};

class Q4_Kx8KernelTest : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    saved_level_ = ActiveKernelSimdLevel();
    saved_vnni_ = ActiveKernelUsesVnni();
    if (!SetSimdLevelForTesting(GetParam().level, GetParam().vnni)) {
      GTEST_SKIP() << "this CPU cannot run " << GetParam().name;
    }
  }
  void TearDown() override { SetSimdLevelForTesting(saved_level_, saved_vnni_); }

 private:
  SimdLevel saved_level_ = SimdLevel::kPortable;
  bool saved_vnni_ = false;
};

TEST_P(Q4_Kx8KernelTest, MatchesDoubleReferenceAndRowLayout) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      const Q4KMatrix m = MakeMatrix(rows, cols, static_cast<uint32_t>(rows * 7 + cols));
      const int64_t n_tokens = 3;
      const std::vector<float> x = Activations(n_tokens * cols, static_cast<uint32_t>(cols));
      const std::vector<float> y = Multiply(m.packed, x, n_tokens, 2);
      const std::vector<float> y_rows = Multiply(m.view, x, n_tokens, 2);
      const double nb = static_cast<double>(cols / kQK_K);
      std::vector<uint8_t> q8k(cols / kQK_K * kQ8KBlockBytes);
      for (int64_t t = 0; t < n_tokens; ++t) {
        QuantizeRowQ8_K(x.data() + t * cols, q8k.data(), cols);
        for (int64_t r = 0; r < rows; ++r) {
          double ref, p;
          Reference(m.rows.data() + r * m.view.row_bytes, q8k.data(), cols, &ref, &p);
          const float got = y[t * rows + r];
          EXPECT_LE(std::fabs(got - ref), (nb + 2) * FLT_EPSILON * p + 1e-30)
              << rows << "x" << cols << " row " << r << " token " << t;
          EXPECT_LE(std::fabs(static_cast<double>(got) - y_rows[t * rows + r]),
                    (2 * nb + 4) * FLT_EPSILON * p + 1e-30)
              << rows << "x" << cols << " row " << r << " token " << t << " vs row layout";
        }
      }
    }
  }
}

TEST_P(Q4_Kx8KernelTest, ThreadsBatchesAndRangesAreBitIdentical) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      const Q4KMatrix m = MakeMatrix(rows, cols, static_cast<uint32_t>(rows + cols));
      const int64_t n_tokens = 6;  // a full 4-token tile and a partial one
      const std::vector<float> x = Activations(n_tokens * cols, 5);
      const std::vector<float> base = Multiply(m.packed, x, n_tokens, 1);
      for (int threads : {2, 3}) {
        EXPECT_TRUE(SameBits(Multiply(m.packed, x, n_tokens, threads), base))
            << rows << "x" << cols << " threads " << threads;
      }
      for (int64_t t = 0; t < n_tokens; ++t) {
        const std::vector<float> one(x.begin() + t * cols, x.begin() + (t + 1) * cols);
        const std::vector<float> y1 = Multiply(m.packed, one, 1, 1);
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

// The sparse products never see the interleaved copy: they equal the row layout's exactly.
TEST_P(Q4_Kx8KernelTest, GatherAndAxpyKeepTheRowLayout) {
  const Q4KMatrix m = MakeMatrix(33, 512, 9);
  const std::vector<float> x = Activations(512, 10);
  ThreadPool pool(2);
  const std::vector<int32_t> ids = {32, 0, 7, 8, 9, 31, 16};
  std::vector<float> a(ids.size()), b(ids.size());
  GatherMatMul(m.packed, ids.data(), static_cast<int64_t>(ids.size()), x.data(), a.data(), pool);
  GatherMatMul(m.view, ids.data(), static_cast<int64_t>(ids.size()), x.data(), b.data(), pool);
  EXPECT_TRUE(SameBits(a, b));
  const std::vector<float> rows_y = Multiply(m.view, x, 1, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a[i], &rows_y[ids[i]], sizeof(float)), 0) << "id " << ids[i];
  }
  std::vector<float> ya(512, 0.25f), yb(512, 0.25f);
  AxpyRows(m.packed, ids.data(), x.data(), static_cast<int64_t>(ids.size()), ya.data(), pool);
  AxpyRows(m.view, ids.data(), x.data(), static_cast<int64_t>(ids.size()), yb.data(), pool);
  EXPECT_TRUE(SameBits(ya, yb));
}

INSTANTIATE_TEST_SUITE_P(Families, Q4_Kx8KernelTest, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return std::string(info.param.name);
                         });

// Same operations in the same order (q4_kx8.cc, q4_kx8_avx2.cc): the same bits, GEMV and GEMM.
TEST(Q4_Kx8FamiliesTest, PortableAndAvx2AgreeBitForBit) {
  if (!matmul_internal::CpuHasAvx2()) GTEST_SKIP() << "no AVX2";
  const SimdLevel saved = ActiveKernelSimdLevel();
  const bool saved_vnni = ActiveKernelUsesVnni();
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      const Q4KMatrix m = MakeMatrix(rows, cols, static_cast<uint32_t>(3 * rows + cols));
      for (int64_t n_tokens : {1, 5}) {
        const std::vector<float> x = Activations(n_tokens * cols, 11);
        ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kPortable));
        const std::vector<float> portable = Multiply(m.packed, x, n_tokens, 2);
        ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kAvx2));
        const std::vector<float> avx2 = Multiply(m.packed, x, n_tokens, 2);
        EXPECT_TRUE(SameBits(portable, avx2)) << rows << "x" << cols << " tokens " << n_tokens;
      }
    }
  }
  SetSimdLevelForTesting(saved, saved_vnni);
}

}  // namespace
}  // namespace thermocline
