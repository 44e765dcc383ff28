// Attention's two products (shared/kernels/attention.h) in every kernel family against a
// double-precision reference, and avx2 against avx512 bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/kernels/attention.h"
#include "shared/kernels/dispatch.h"
#include "shared/util/cpu_features.h"
#include "shared/util/fp16.h"
#include "tests/kernel_families.h"

namespace thermocline {
namespace {

constexpr int64_t kHeadDims[] = {1, 7, 8, 13, 64, 72, 80, 128, 136, 256};
constexpr int64_t kCounts[] = {1, 2, 3, 7, 8, 9, 33};

// n rows of head_dim elements, each in its own allocation at an odd element offset (rows of a
// paged KV cache are neither adjacent nor vector-aligned), plus their exact values.
struct Rows {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<const uint8_t*> ptrs;
  std::vector<double> values;  // n x head_dim
};

Rows MakeRows(GgmlType type, int64_t n, int64_t head_dim, std::mt19937& rng) {
  const int64_t elem = type == GgmlType::kF16 ? 2 : 4;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Rows r;
  for (int64_t j = 0; j < n; ++j) {
    std::vector<uint8_t> buf((head_dim + 1) * elem);
    uint8_t* row = buf.data() + elem;
    for (int64_t i = 0; i < head_dim; ++i) {
      const float f = normal(rng);
      if (type == GgmlType::kF16) {
        const uint16_t h = Fp32ToFp16(f);
        std::memcpy(row + 2 * i, &h, 2);
        r.values.push_back(Fp16ToFp32(h));
      } else {
        std::memcpy(row + 4 * i, &f, 4);
        r.values.push_back(f);
      }
    }
    r.storage.push_back(std::move(buf));
    r.ptrs.push_back(r.storage.back().data() + elem);
  }
  return r;
}

// A sum of m products rounded in any order, each product and addition rounded once (or fused),
// is within gamma_(m+1) * sum |terms| of the exact sum (Higham, Thm 3.1), plus one rounding of the
// result's scaling.
double Bound(int64_t m, double abs_sum, double value) {
  const double u = std::numeric_limits<float>::epsilon() / 2;
  const double gamma = (m + 1) * u / (1 - (m + 1) * u);
  return gamma * abs_sum + u * std::fabs(value) + std::numeric_limits<float>::denorm_min();
}

class AttentionKernelTest : public testing::KernelFamilyTest {};

TEST_P(AttentionKernelTest, ScoresMatchDoubleReference) {
  std::mt19937 rng(3);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16}) {
    for (int64_t hd : kHeadDims) {
      for (int64_t n : kCounts) {
        const Rows k = MakeRows(type, n, hd, rng);
        const std::vector<float> q = testing::NormalVector(hd, rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<float> scores(n + 1, -7.0f);
        AttentionScores(type, q.data(), k.ptrs.data(), n, hd, scale, scores.data());
        for (int64_t j = 0; j < n; ++j) {
          double exact = 0.0, abs_sum = 0.0;
          for (int64_t i = 0; i < hd; ++i) {
            exact += q[i] * k.values[j * hd + i];
            abs_sum += std::fabs(q[i] * k.values[j * hd + i]);
          }
          exact *= scale;
          EXPECT_NEAR(scores[j], exact, Bound(hd, abs_sum * scale, exact))
              << TypeTraits(type).name << " head_dim " << hd << " n " << n << " j " << j;
        }
        EXPECT_EQ(scores[n], -7.0f) << "wrote past the end";
      }
    }
  }
}

TEST_P(AttentionKernelTest, MixMatchesDoubleReference) {
  std::mt19937 rng(4);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16}) {
    for (int64_t hd : kHeadDims) {
      for (int64_t n : kCounts) {
        const Rows v = MakeRows(type, n, hd, rng);
        std::vector<float> w = testing::NormalVector(n, rng);
        std::vector<float> out(hd + 1, -7.0f);
        AttentionMix(type, w.data(), v.ptrs.data(), n, hd, out.data());
        for (int64_t i = 0; i < hd; ++i) {
          double exact = 0.0, abs_sum = 0.0;
          for (int64_t j = 0; j < n; ++j) {
            exact += w[j] * v.values[j * hd + i];
            abs_sum += std::fabs(w[j] * v.values[j * hd + i]);
          }
          EXPECT_NEAR(out[i], exact, Bound(n, abs_sum, 0.0))
              << TypeTraits(type).name << " head_dim " << hd << " n " << n << " i " << i;
        }
        EXPECT_EQ(out[hd], -7.0f) << "wrote past the end";
      }
    }
  }
}

TEST_P(AttentionKernelTest, MixOfNoRowsIsZero) {
  std::vector<float> out(72, 5.0f);
  AttentionMix(GgmlType::kF32, nullptr, nullptr, 0, 72, out.data());
  for (float f : out) EXPECT_EQ(f, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Families, AttentionKernelTest,
                         ::testing::ValuesIn(testing::kKernelFamilies), testing::KernelFamilyName);

TEST(AttentionFamiliesTest, Avx2AndAvx512AgreeBitForBit) {
  if (CpuSimdLevel() < SimdLevel::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  const SimdLevel saved = ActiveKernelSimdLevel();
  const bool saved_vnni = ActiveKernelUsesVnni();
  std::mt19937 rng(5);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16}) {
    for (int64_t hd : kHeadDims) {
      for (int64_t n : kCounts) {
        const Rows rows = MakeRows(type, n, hd, rng);
        const std::vector<float> q = testing::NormalVector(hd, rng),
                                 w = testing::NormalVector(n, rng);
        std::vector<float> s2(n), s5(n), m2(hd), m5(hd);
        ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kAvx2));
        AttentionScores(type, q.data(), rows.ptrs.data(), n, hd, 0.125f, s2.data());
        AttentionMix(type, w.data(), rows.ptrs.data(), n, hd, m2.data());
        ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kAvx512));
        AttentionScores(type, q.data(), rows.ptrs.data(), n, hd, 0.125f, s5.data());
        AttentionMix(type, w.data(), rows.ptrs.data(), n, hd, m5.data());
        const std::string what = std::string(TypeTraits(type).name) + " head_dim " +
                                 std::to_string(hd) + " n " + std::to_string(n);
        EXPECT_TRUE(testing::SameBits(s2, s5)) << what << " scores";
        EXPECT_TRUE(testing::SameBits(m2, m5)) << what << " mix";
      }
    }
  }
  SetSimdLevelForTesting(saved, saved_vnni);
}

}  // namespace
}  // namespace thermocline
