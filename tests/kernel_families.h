// The kernel families the kernel tests run over (every SIMD level the build has; a family this
// CPU cannot run skips, saying so), a fixture that selects one and restores the previous one,
// and the small helpers those tests share.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
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
#include "shared/util/cpu_features.h"
#include "shared/util/fp16.h"
#include "shared/util/thread_pool.h"

namespace thermocline::testing {

// A kernel family: SIMD level plus, for AVX2, whether quantized block sums use AVX-VNNI.
struct KernelFamily {
  SimdLevel level;
  bool vnni;
  const char* name;
};
inline constexpr KernelFamily kKernelFamilies[] = {{SimdLevel::kPortable, false, "portable"},
                                                   {SimdLevel::kAvx2, false, "avx2"},
                                                   {SimdLevel::kAvx2, true, "avx2_vnni"},
                                                   {SimdLevel::kAvx512, false, "avx512"}};

inline void PrintTo(const KernelFamily& f, std::ostream* os) { *os << f.name; }

// For INSTANTIATE_TEST_SUITE_P(..., ::testing::ValuesIn(kKernelFamilies), KernelFamilyName).
inline std::string KernelFamilyName(const ::testing::TestParamInfo<KernelFamily>& info) {
  return info.param.name;
}

class KernelFamilyTest : public ::testing::TestWithParam<KernelFamily> {
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

// W x for n_tokens tokens of x (stride w.cols) through MatMul on a pool of `threads`; the
// output is prefilled with -1 so that an unwritten entry shows.
inline std::vector<float> MultiplyOnPool(const MatrixView& w, const std::vector<float>& x,
                                         int64_t n_tokens, int threads) {
  ThreadPool pool(threads);
  std::vector<float> y(n_tokens * w.rows, -1.0f);
  MatMul(w, x.data(), n_tokens, w.cols, y.data(), w.rows, pool);
  return y;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every weight type the kernel sets cover.
inline constexpr GgmlType kWeightTypes[] = {
    GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,   GgmlType::kQ4_0,
    GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K,   GgmlType::kQ3_K,
    GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS};

// n values from N(0, 1): activations, coefficients, attention rows.
inline std::vector<float> NormalVector(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

// The activations as every kernel with Q8_0 inputs sees them: Q8_0-rounded by ggml's reference,
// back in f32.
inline std::vector<float> Q8Rounded(const float* x, int64_t cols) {
  std::vector<uint8_t> q(RowBytes(GgmlType::kQ8_0, cols));
  std::vector<float> out(cols);
  QuantizeRow(GgmlType::kQ8_0, x, q.data(), cols);
  DequantizeRow(GgmlType::kQ8_0, q.data(), out.data(), cols);
  return out;
}

// A matrix of a type with an interleaved layout (interleaved8.h), in both layouts.
struct InterleavedMatrix {
  std::vector<uint8_t> rows;         // file layout
  std::vector<uint8_t> interleaved;  // interleaved8.h layout
  std::vector<float> deq;            // [rows][cols], where a test fills it
  MatrixView view;                   // row layout only
  MatrixView packed;                 // the same with the interleaved copy
};

// Makes m.interleaved, m.view and m.packed from m.rows (n_rows rows of `cols` columns).
inline void AddInterleavedCopy(GgmlType type, int64_t n_rows, int64_t cols, InterleavedMatrix& m) {
  const int64_t row_bytes = RowBytes(type, cols);
  m.interleaved.resize(Interleaved8Bytes(type, n_rows, cols));
  Interleave8(type, m.rows.data(), row_bytes, n_rows, cols, m.interleaved.data());
  m.view = MatrixView{type, n_rows, cols, m.rows.data(), row_bytes};
  m.packed = m.view;
  m.packed.interleaved = m.interleaved.data();
}

// Where the fp16 scales sit in a block of the types we cannot quantize yet (ggml_type.h).
inline std::vector<int> HalfOffsets(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ5_0:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS:
      return {0};
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// Random bytes in every field (all nibble, bit-plane and packed-scale patterns occur) with
// finite fp16 scales of the row's magnitude.
inline void RandomBlocks(GgmlType type, int64_t cols, float magnitude, std::mt19937& rng,
                         uint8_t* dst) {
  const GgmlTypeTraits& t = TypeTraits(type);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.25f, 1.0f);
  for (int64_t b = 0; b < cols / t.block_size; ++b) {
    uint8_t* blk = dst + b * t.block_bytes;
    for (int64_t i = 0; i < t.block_bytes; ++i) blk[i] = static_cast<uint8_t>(byte(rng));
    for (int at : HalfOffsets(type)) {
      const uint16_t h = Fp32ToFp16(magnitude * unit(rng) * (byte(rng) % 2 ? 1.0f : -1.0f));
      std::memcpy(blk + at, &h, 2);
    }
  }
}

}  // namespace thermocline::testing
