// The avx512 kernel family gives the avx2 family's bits for every weight type and kernel: its
// kernels keep each AVX2 accumulator lane's sequence of operations and pack two of them per
// zmm (matmul_kernels.h), so a model's tokens do not depend on which of the two a CPU runs.
// (Both are checked against the double reference in matmul_test, q4_0x8_test and
// kquant_x8_test; this is the stronger check between them.)
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/interleaved8.h"
#include "shared/gguf/matrix_view.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/dispatch.h"
#include "shared/kernels/matmul.h"
#include "shared/kernels/matmul_kernels.h"
#include "shared/util/cpu_features.h"
#include "shared/util/fp16.h"
#include "shared/util/thread_pool.h"
#include "tests/kernel_families.h"

namespace thermocline {
namespace {

struct Matrix {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> interleaved;  // empty when the type has no interleaved layout
  MatrixView rows;                   // the row layout
  MatrixView packed;                 // the same with the interleaved copy, when there is one
};

// Float types get normal values (no NaN or Inf, whose payloads would say nothing about the
// kernels); block types random bytes with finite scales (every bit pattern of the quants).
Matrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const GgmlTypeTraits& t = TypeTraits(type);
  const int64_t row_bytes = cols / t.block_size * t.block_bytes;
  Matrix m;
  m.bytes.resize(rows * row_bytes);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.bytes.data() + r * row_bytes;
    if (t.block_size == 1) {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = normal(rng);
        if (type == GgmlType::kF32) {
          std::memcpy(row + 4 * c, &v, 4);
        } else {
          const uint16_t h = type == GgmlType::kF16 ? Fp32ToFp16(v) : Fp32ToBf16(v);
          std::memcpy(row + 2 * c, &h, 2);
        }
      }
    } else {
      testing::RandomBlocks(type, cols, 1.0f / 64, rng, row);
      // Q8_0 quants are in [-127, 127] as ggml's quantizer writes them: avx2's sign-trick
      // engine, like ggml's own AVX2 kernel, cannot negate -128.
      if (type == GgmlType::kQ8_0) {
        for (int64_t i = 0; i < row_bytes; ++i) {
          if (i % t.block_bytes >= 2 && row[i] == 0x80) row[i] = 0x81;
        }
      }
    }
  }
  m.rows = MatrixView{type, rows, cols, m.bytes.data(), row_bytes};
  m.packed = m.rows;
  if (HasInterleaved8Layout(type)) {
    m.interleaved.resize(Interleaved8Bytes(type, rows, cols));
    Interleave8(type, m.bytes.data(), row_bytes, rows, cols, m.interleaved.data());
    m.packed.interleaved = m.interleaved.data();
  }
  return m;
}

std::string Shape(GgmlType type, int64_t rows, int64_t cols) {
  return std::string(TypeTraits(type).name) + " " + std::to_string(rows) + "x" +
         std::to_string(cols);
}

class Avx512Test : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_level_ = ActiveKernelSimdLevel();
    saved_vnni_ = ActiveKernelUsesVnni();
    if (CpuSimdLevel() < SimdLevel::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  }
  void TearDown() override { SetSimdLevelForTesting(saved_level_, saved_vnni_); }

  // f() under the avx2 family (plain and with AVX-VNNI where the CPU has it: both give the same
  // bits, matmul_test's VnniTest) and under avx512; expects the same bits from each.
  template <class F>
  void ExpectSameBits(const std::string& what, F&& f) {
    ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kAvx2));
    const std::vector<float> avx2 = f();
    ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kAvx512));
    const std::vector<float> avx512 = f();
    ASSERT_EQ(avx2.size(), avx512.size()) << what;
    if (testing::SameBits(avx2, avx512)) return;
    for (size_t i = 0; i < avx2.size(); ++i) {
      if (std::memcmp(&avx2[i], &avx512[i], sizeof(float)) != 0) {
        ADD_FAILURE() << what << ": first difference at " << i << ": avx2 " << avx2[i]
                      << ", avx512 " << avx512[i];
        return;
      }
    }
  }

 private:
  SimdLevel saved_level_ = SimdLevel::kPortable;
  bool saved_vnni_ = false;
};

// Shapes that reach every tile (rows below, at and past the GEMV and GEMM tiles, odd counts
// that leave one row of a pair alone) and columns from one block up, with ragged float tails.
TEST_F(Avx512Test, MatMulSameBitsAsAvx2) {
  std::mt19937 rng(5);
  for (GgmlType type : testing::kWeightTypes) {
    const int64_t bs = TypeTraits(type).block_size;
    for (int64_t rows : {1, 2, 3, 7, 8, 9, 16, 17, 33, 67}) {
      const std::vector<int64_t> col_set = bs == 1 ? std::vector<int64_t>{13, 77, 1029}
                                                   : std::vector<int64_t>{bs, 3 * bs, 1024 + bs};
      for (int64_t cols : col_set) {
        Matrix m = MakeMatrix(type, rows, cols, rng);
        for (int64_t n_tokens : {1, 2, 3, 5, 9}) {
          const std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
          for (int threads : {1, 3}) {
            for (const MatrixView* w : {&m.rows, &m.packed}) {
              if (w == &m.packed && m.interleaved.empty()) continue;
              ExpectSameBits(Shape(type, rows, cols) + " tokens " + std::to_string(n_tokens) +
                                 " threads " + std::to_string(threads) +
                                 (w == &m.packed ? " interleaved" : ""),
                             [&] { return testing::MultiplyOnPool(*w, x, n_tokens, threads); });
            }
          }
        }
      }
    }
  }
}

TEST_F(Avx512Test, GatherMatMulSameBitsAsAvx2) {
  std::mt19937 rng(6);
  for (GgmlType type : testing::kWeightTypes) {
    const int64_t bs = TypeTraits(type).block_size;
    const int64_t rows = 41, cols = bs == 1 ? 333 : 4 * bs;
    Matrix m = MakeMatrix(type, rows, cols, rng);
    const std::vector<float> x = testing::NormalVector(cols, rng);
    const std::vector<std::vector<int32_t>> id_sets = {
        {7}, {40, 0}, {3, 3, 3}, {1, 5, 9, 13, 17, 21, 25, 29, 33}, {40, 2, 17, 8, 33, 0, 21}};
    for (const auto& ids : id_sets) {
      for (int threads : {1, 2}) {
        ExpectSameBits(Shape(type, rows, cols) + " ids " + std::to_string(ids.size()), [&] {
          ThreadPool pool(threads);
          std::vector<float> y(ids.size(), -1.0f);
          GatherMatMul(m.rows, ids.data(), static_cast<int64_t>(ids.size()), x.data(), y.data(),
                       pool);
          return y;
        });
      }
    }
  }
}

TEST_F(Avx512Test, AxpyRowsSameBitsAsAvx2) {
  std::mt19937 rng(7);
  for (GgmlType type : testing::kWeightTypes) {
    const int64_t bs = TypeTraits(type).block_size;
    for (int64_t cols : {bs == 1 ? int64_t{21} : bs, bs == 1 ? int64_t{2050} : 8 * bs}) {
      const int64_t rows = 300;
      Matrix m = MakeMatrix(type, rows, cols, rng);
      std::vector<int32_t> ids;
      for (int i = 0; i < 257; ++i) ids.push_back(static_cast<int32_t>((i * 37) % rows));
      const std::vector<float> coeffs =
          testing::NormalVector(static_cast<int64_t>(ids.size()), rng);
      const std::vector<float> y0 = testing::NormalVector(cols, rng);
      for (int64_t n : {int64_t{1}, int64_t{5}, static_cast<int64_t>(ids.size())}) {
        for (int threads : {1, 2}) {
          ExpectSameBits(Shape(type, rows, cols) + " ids " + std::to_string(n), [&] {
            ThreadPool pool(threads);
            std::vector<float> y = y0;
            AxpyRows(m.rows, ids.data(), coeffs.data(), n, y.data(), pool);
            return y;
          });
        }
      }
    }
  }
}

TEST_F(Avx512Test, DequantizeSameBitsAsAvx2) {
  std::mt19937 rng(8);
  for (GgmlType type : testing::kWeightTypes) {
    const int64_t bs = TypeTraits(type).block_size;
    const int64_t rows = 3, cols = bs == 1 ? 77 : 5 * bs;
    Matrix m = MakeMatrix(type, rows, cols, rng);
    ExpectSameBits(Shape(type, rows, cols), [&] {
      std::vector<float> out(rows * cols);
      for (int64_t r = 0; r < rows; ++r) DequantizeMatrixRow(m.rows, r, out.data() + r * cols);
      return out;
    });
  }
}

// The K-quant row kernels' token tiles (up to 6 tokens per pair of rows): every tile width,
// full and ragged, with an odd row left over.
TEST_F(Avx512Test, KQuantTokenTilesSameBitsAsAvx2) {
  std::mt19937 rng(9);
  for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                        GgmlType::kQ6_K, GgmlType::kIQ4_XS}) {
    const int64_t rows = 5, cols = 2 * kQK_K;
    Matrix m = MakeMatrix(type, rows, cols, rng);
    for (int64_t n_tokens : {4, 6, 7, 12, 13}) {
      const std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
      ExpectSameBits(Shape(type, rows, cols) + " tokens " + std::to_string(n_tokens),
                     [&] { return testing::MultiplyOnPool(m.rows, x, n_tokens, 1); });
    }
  }
}

// The interleaved layouts' tiles (two groups per zmm, up to 8 tokens): matrices of several L2
// blocks of groups with an odd group left, token counts that end full and partial tiles.
TEST_F(Avx512Test, InterleavedTilesSameBitsAsAvx2) {
  std::mt19937 rng(9);
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ8_0, GgmlType::kQ4_K,
                        GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS, GgmlType::kQ3_K}) {
    const int64_t rows = 8 * 61 + 5, cols = 2048;
    Matrix m = MakeMatrix(type, rows, cols, rng);
    // 17, 30 and 64 tokens take AMX's 16-token tiles for Q4_0 where the CPU has AMX.
    for (int64_t n_tokens : {1, 8, 17, 30, 64}) {
      const std::vector<float> x = testing::NormalVector(n_tokens * cols, rng);
      for (int threads : {1, 2}) {
        ExpectSameBits(Shape(type, rows, cols) + " tokens " + std::to_string(n_tokens) +
                           " threads " + std::to_string(threads),
                       [&] { return testing::MultiplyOnPool(m.packed, x, n_tokens, threads); });
      }
    }
  }
}

// Every weight type runs AVX-512 code in the avx512 family: no slot is still the avx2 table's
// (avx512_set.cc starts from a copy of it). The interleaved layouts' activation preparations
// are avx2's on purpose (they write bytes, not results); their dot products are not.
TEST(Avx512SetTest, EverySlotHasItsOwnKernels) {
  if (CpuSimdLevel() < SimdLevel::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  const matmul_internal::KernelSet& avx512 = matmul_internal::Avx512Kernels();
  for (bool vnni : {false, true}) {
    const matmul_internal::KernelSet& avx2 = matmul_internal::Avx2Kernels(vnni);
    EXPECT_NE(avx512.quantize_q8_0, avx2.quantize_q8_0);
    for (GgmlType type : testing::kWeightTypes) {
      const std::string name(TypeTraits(type).name);
      ASSERT_TRUE(avx512.Has(type)) << name;
      const matmul_internal::TypeKernels& a = avx512.For(type);
      const matmul_internal::TypeKernels& b = avx2.For(type);
      EXPECT_NE(a.dot, b.dot) << name;
      EXPECT_NE(a.axpy, b.axpy) << name;
      EXPECT_NE(a.dequantize, b.dequantize) << name;
      if (b.prepare_input != nullptr) {
        EXPECT_NE(a.prepare_input, b.prepare_input) << name;
      }
      if (avx2.HasIntAxpy(type)) {
        ASSERT_TRUE(avx512.HasIntAxpy(type)) << name;
        EXPECT_NE(avx512.int_axpy[static_cast<size_t>(type)],
                  avx2.int_axpy[static_cast<size_t>(type)])
            << name;
      }
      if (avx2.HasInterleaved8(type)) {
        ASSERT_TRUE(avx512.HasInterleaved8(type)) << name;
        EXPECT_NE(avx512.interleaved8[static_cast<size_t>(type)].dot,
                  avx2.interleaved8[static_cast<size_t>(type)].dot)
            << name;
      }
    }
  }
}

}  // namespace
}  // namespace thermocline
