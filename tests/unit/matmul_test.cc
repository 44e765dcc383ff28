#include "shared/kernels/matmul.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/kernels/dispatch.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/model/ggml_type.h"
#include "shared/model/quant.h"
#include "shared/util/cpu_features.h"
#include "shared/util/fp16.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

namespace {

// A kernel family: SIMD level plus, for AVX2, whether quantized block sums use AVX-VNNI.
struct Family {
  SimdLevel level;
  bool vnni;
  const char* name;
};
constexpr Family kFamilies[] = {{SimdLevel::kPortable, false, "portable"},
                                {SimdLevel::kAvx2, false, "avx2"},
                                {SimdLevel::kAvx2, true, "avx2_vnni"}};

void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

constexpr GgmlType kAllTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                                  GgmlType::kQ4_0};

bool IsQuant(GgmlType t) { return t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0; }

// A random matrix quantized with the reference QuantizeRow, plus its dequantized values: the
// exact operands the kernels multiply.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // rows x cols
  MatrixView view;
};

TestMatrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestMatrix m;
  const int64_t rb = RowBytes(type, cols);
  // One spare byte in front puts every row at an odd address, as in a GGUF file with alignment 1.
  m.bytes.assign(rows * rb + 1, 0);
  m.deq.resize(rows * cols);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(-3.0f, 3.0f);
  std::vector<float> src(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = std::exp(scale(rng));  // rows of very different magnitude
    for (int64_t c = 0; c < cols; ++c) src[c] = normal(rng) * s;
    // An all-zero block exercises the d = 0 path of the quantized formats.
    if (r % 7 == 3) std::fill(src.begin(), src.begin() + std::min<int64_t>(cols, kQK), 0.0f);
    QuantizeRow(type, src.data(), m.bytes.data() + 1 + r * rb, cols);
    DequantizeRow(type, m.bytes.data() + 1 + r * rb, m.deq.data() + r * cols, cols);
  }
  m.view = MatrixView{type, rows, cols, m.bytes.data() + 1, rb};
  return m;
}

std::vector<float> RandomVector(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

// What the kernels see of the activations: Q8_0-rounded for quantized weights.
std::vector<float> EffectiveInput(GgmlType type, const float* x, int64_t cols) {
  std::vector<float> out(x, x + cols);
  if (IsQuant(type)) {
    std::vector<uint8_t> q(RowBytes(GgmlType::kQ8_0, cols));
    QuantizeRow(GgmlType::kQ8_0, x, q.data(), cols);
    DequantizeRow(GgmlType::kQ8_0, q.data(), out.data(), cols);
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

class KernelTest : public ::testing::TestWithParam<Family> {
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
  for (GgmlType type : kAllTypes) {
    for (const Shape& s : shapes) {
      const int64_t cols = IsQuant(type) ? (s.cols + kQK - 1) / kQK * kQK : s.cols;
      TestMatrix m = MakeMatrix(type, s.rows, cols, rng);
      for (int64_t n_tokens : {1, 3, 17}) {
        if (s.rows >= 300 && n_tokens > 3) continue;  // keep the reference cheap
        const int64_t x_stride = cols + 3, y_stride = s.rows + 2;
        std::vector<float> x = RandomVector(n_tokens * x_stride, rng);
        std::vector<double> ref(n_tokens * s.rows), bound(n_tokens * s.rows);
        for (int64_t t = 0; t < n_tokens; ++t) {
          const std::vector<float> xe = EffectiveInput(type, x.data() + t * x_stride, cols);
          for (int64_t r = 0; r < s.rows; ++r) {
            double sum = 0, sum_abs = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double p = static_cast<double>(m.deq[r * cols + c]) * xe[c];
              sum += p;
              sum_abs += std::fabs(p);
            }
            ref[t * s.rows + r] = sum;
            bound[t * s.rows + r] = Tolerance(cols, sum_abs);
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
  for (GgmlType type : kAllTypes) {
    const int64_t rows = 77, cols = IsQuant(type) ? 320 : 300, n_tokens = 17;
    TestMatrix m = MakeMatrix(type, rows, cols, rng);
    std::vector<float> x = RandomVector(n_tokens * cols, rng);
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

TEST_P(KernelTest, GatherMatMulEqualsDenseRows) {
  std::mt19937 rng(7);
  for (GgmlType type : kAllTypes) {
    const int64_t rows = 500, cols = IsQuant(type) ? 2048 : 2043;
    TestMatrix m = MakeMatrix(type, rows, cols, rng);
    std::vector<float> x = RandomVector(cols, rng);
    ThreadPool pool1(1);
    std::vector<float> dense(rows);
    MatMul(m.view, x.data(), 1, cols, dense.data(), rows, pool1);
    // Unsorted, with repeats, and short lists that do not fill a tile.
    std::uniform_int_distribution<int32_t> pick(0, rows - 1);
    for (int64_t n_ids : {1, 3, 9, 301}) {
      std::vector<int32_t> ids(n_ids);
      for (int32_t& id : ids) id = pick(rng);
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
  // Small lists (one thread, ragged float rows) and a long one that every pool size splits.
  const Case cases[] = {{10, 43, 5}, {50, 96, 7}, {400, 2048, 300}};
  for (GgmlType type : kAllTypes) {
    for (const Case& k : cases) {
      const int64_t cols = IsQuant(type) ? (k.cols + kQK - 1) / kQK * kQK : k.cols;
      TestMatrix m = MakeMatrix(type, k.rows, cols, rng);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(k.rows) - 1);
      std::vector<int32_t> ids(k.n_ids);
      for (int32_t& id : ids) id = pick(rng);
      const std::vector<float> coeffs = RandomVector(k.n_ids, rng);
      const std::vector<float> y0 = RandomVector(cols, rng);
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

TEST_P(KernelTest, DequantizeMatrixRowMatchesReference) {
  std::mt19937 rng(3);
  for (GgmlType type : kAllTypes) {
    TestMatrix m = MakeMatrix(type, 4, 64, rng);
    std::vector<float> row(64);
    DequantizeMatrixRow(m.view, 2, row.data());
    EXPECT_EQ(std::memcmp(row.data(), m.deq.data() + 2 * 64, 64 * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, KernelTest, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return std::string(info.param.name);
                         });

// AVX-VNNI only changes how the exact integer block sums are formed (see matmul_avx2.cc), so
// both AVX2 variants must agree bit for bit.
TEST(VnniTest, SameBitsAsPlainAvx2) {
  if (!matmul_internal::CpuHasAvxVnni()) GTEST_SKIP() << "no AVX-VNNI";
  std::mt19937 rng(21);
  const matmul_internal::KernelSet& plain = matmul_internal::Avx2Kernels(false);
  const matmul_internal::KernelSet& vnni = matmul_internal::Avx2Kernels(true);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const int64_t rows = 37, cols = 640, n_tokens = 5;
    TestMatrix m = MakeMatrix(type, rows, cols, rng);
    std::vector<float> x = RandomVector(n_tokens * cols, rng);
    const int64_t in_bytes = plain.input_bytes(cols);
    ASSERT_EQ(in_bytes, vnni.input_bytes(cols));
    std::vector<uint8_t> in_plain(n_tokens * in_bytes), in_vnni(n_tokens * in_bytes);
    for (int64_t t = 0; t < n_tokens; ++t) {
      plain.prepare_input(type, x.data() + t * cols, cols, in_plain.data() + t * in_bytes);
      vnni.prepare_input(type, x.data() + t * cols, cols, in_vnni.data() + t * in_bytes);
    }
    std::vector<float> y_plain(n_tokens * rows), y_vnni(n_tokens * rows);
    const matmul_internal::RowSource src{m.view.data, m.view.row_bytes, nullptr};
    plain.For(type).dot(src, rows, cols, in_plain.data(), in_bytes, n_tokens, y_plain.data(), rows);
    vnni.For(type).dot(src, rows, cols, in_vnni.data(), in_bytes, n_tokens, y_vnni.data(), rows);
    EXPECT_EQ(std::memcmp(y_plain.data(), y_vnni.data(), y_plain.size() * sizeof(float)), 0)
        << TypeName(type);
  }
}

// The activation quantizer of every kernel family must reproduce ggml's reference rounding
// (roundf: ties away from zero) bit for bit, or quantized results would drift from llama.cpp's.
TEST(ActivationQuantizeTest, EveryLevelMatchesQuantizeRow) {
  std::mt19937 rng(11);
  const int64_t n = 32 * 64;
  std::vector<float> x = RandomVector(n, rng);
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
