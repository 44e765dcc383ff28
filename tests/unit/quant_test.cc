#include "shared/gguf/quant.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/util/fp16.h"

namespace thermocline {
namespace {

TEST(GgmlTypeTest, TraitsMatchGgml) {
  struct Expected {
    uint32_t id;
    const char* name;
    int64_t block_size;
    int64_t block_bytes;
  };
  for (const Expected& e : {Expected{0, "f32", 1, 4},         Expected{1, "f16", 1, 2},
                            Expected{2, "q4_0", 32, 18},      Expected{3, "q4_1", 32, 20},
                            Expected{6, "q5_0", 32, 22},      Expected{7, "q5_1", 32, 24},
                            Expected{8, "q8_0", 32, 34},      Expected{9, "q8_1", 32, 36},
                            Expected{10, "q2_K", 256, 84},    Expected{11, "q3_K", 256, 110},
                            Expected{12, "q4_K", 256, 144},   Expected{13, "q5_K", 256, 176},
                            Expected{14, "q6_K", 256, 210},   Expected{15, "q8_K", 256, 292},
                            Expected{16, "iq2_xxs", 256, 66}, Expected{17, "iq2_xs", 256, 74},
                            Expected{18, "iq3_xxs", 256, 98}, Expected{19, "iq1_s", 256, 50},
                            Expected{20, "iq4_nl", 32, 18},   Expected{21, "iq3_s", 256, 110},
                            Expected{22, "iq2_s", 256, 82},   Expected{23, "iq4_xs", 256, 136},
                            Expected{24, "i8", 1, 1},         Expected{25, "i16", 1, 2},
                            Expected{26, "i32", 1, 4},        Expected{27, "i64", 1, 8},
                            Expected{28, "f64", 1, 8},        Expected{29, "iq1_m", 256, 56},
                            Expected{30, "bf16", 1, 2},       Expected{34, "tq1_0", 256, 54},
                            Expected{35, "tq2_0", 256, 66},   Expected{39, "mxfp4", 32, 17}}) {
    auto t = TypeTraits(e.id);
    ASSERT_TRUE(t.has_value()) << e.name;
    EXPECT_EQ(t->name, e.name);
    EXPECT_EQ(t->block_size, e.block_size);
    EXPECT_EQ(t->block_bytes, e.block_bytes);
    EXPECT_EQ(static_cast<uint32_t>(t->type), e.id);
    EXPECT_EQ(&TypeTraits(t->type), &TypeTraits(t->type));
    EXPECT_EQ(TypeTraits(t->type).name, e.name);
    auto by_name = TypeFromName(e.name);
    ASSERT_TRUE(by_name.has_value());
    EXPECT_EQ(*by_name, t->type);
  }
  // Ids ggml removed (q4_2, q4_3, the q4_0_4_4 / iq4_nl_4_4 repacks) and ids past the table.
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 1000u, 0xFFFFFFFFu}) {
    EXPECT_FALSE(TypeTraits(id).has_value()) << id;
  }
  EXPECT_FALSE(TypeFromName("F32").has_value());
  EXPECT_FALSE(TypeFromName("q4_k").has_value());  // llama.cpp spells the K upper case
  // Weight types are exactly those with kernels; the others are only listed.
  for (GgmlType t :
       {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ2_K, GgmlType::kQ3_K,
        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS}) {
    EXPECT_TRUE(IsWeightType(t)) << TypeTraits(t).name;
    EXPECT_TRUE(HasDequantizer(t)) << TypeTraits(t).name;
    EXPECT_TRUE(HasQuantizer(t)) << TypeTraits(t).name;
  }
  for (GgmlType t : {GgmlType::kQ8_K, GgmlType::kQ8_1, GgmlType::kIQ3_XXS, GgmlType::kIQ3_S,
                     GgmlType::kI8, GgmlType::kI32, GgmlType::kTQ1_0}) {
    EXPECT_FALSE(IsWeightType(t)) << TypeTraits(t).name;
  }
  EXPECT_EQ(RowBytes(GgmlType::kF32, 64), 256);
  EXPECT_EQ(RowBytes(GgmlType::kF16, 64), 128);
  EXPECT_EQ(RowBytes(GgmlType::kBF16, 64), 128);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_0, 64), 36);
}

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(Fp32ToFp16(0.0f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xC000);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);  // rounds up to infinity
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(5.9604645e-8f), 0x0001);  // smallest subnormal
  // 1 + 2^-11 is halfway between 1 and the next half: ties go to even (1.0).
  EXPECT_EQ(Fp32ToFp16(1.0f + 1.0f / 2048), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(1.0f + 3.0f / 2048), 0x3C02);
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), 5.9604645e-8f);
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7C00)));
  EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(std::nanf("")))));
  // Every finite half survives a round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    ASSERT_EQ(Fp32ToFp16(Fp16ToFp32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(Bf16Test, KnownValues) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(-2.0f), 0xC000);
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even.
  EXPECT_EQ(Fp32ToBf16(1.0f + 1.0f / 256), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(1.0f + 3.0f / 256), 0x3F82);
  const uint16_t nan = Fp32ToBf16(std::nanf(""));
  EXPECT_TRUE(std::isnan(Bf16ToFp32(nan)));
  EXPECT_NE(nan & 0x40, 0);  // quiet
}

std::vector<float> RandomRow(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<float> RoundTrip(GgmlType type, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> bytes(RowBytes(type, n));
  QuantizeRow(type, x.data(), bytes.data(), n);
  std::vector<float> y(n);
  DequantizeRow(type, bytes.data(), y.data(), n);
  return y;
}

TEST(QuantTest, F32IsExact) {
  auto x = RandomRow(96, 1, 3.0f);
  EXPECT_EQ(RoundTrip(GgmlType::kF32, x), x);
}

TEST(QuantTest, F16AndBf16RoundTripWithinHalfUlp) {
  auto x = RandomRow(4096, 2, 2.0f);
  auto f16 = RoundTrip(GgmlType::kF16, x);
  auto bf16 = RoundTrip(GgmlType::kBF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    // 11 and 8 significant bits: relative error at most 2^-11 and 2^-8 (plus the subnormal
    // floor of half, which these magnitudes barely reach).
    EXPECT_LE(std::fabs(f16[i] - x[i]), std::fabs(x[i]) * (1.0f / 2048) + 6e-8f) << i;
    EXPECT_LE(std::fabs(bf16[i] - x[i]), std::fabs(x[i]) * (1.0f / 256)) << i;
  }
}

TEST(QuantTest, Q8_0RoundTripErrorBound) {
  // Scales whose fp16 block scale stays normal (a subnormal scale loses relative precision).
  for (float scale : {0.05f, 1.0f, 100.0f}) {
    auto x = RandomRow(32 * 64, 3, scale);
    auto y = RoundTrip(GgmlType::kQ8_0, x);
    for (size_t b = 0; b < x.size() / kQK; ++b) {
      float amax = 0;
      for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[b * kQK + j]));
      // Half a step of amax/127, plus the fp16 rounding of the scale across 127 steps.
      const float bound = amax / 127 * 0.5f + amax * (1.0f / 1024);
      for (int j = 0; j < kQK; ++j) {
        ASSERT_LE(std::fabs(y[b * kQK + j] - x[b * kQK + j]), bound) << b << " " << j;
      }
    }
  }
}

TEST(QuantTest, Q4_0RoundTripErrorBound) {
  for (float scale : {1e-3f, 1.0f, 100.0f}) {
    auto x = RandomRow(32 * 64, 4, scale);
    auto y = RoundTrip(GgmlType::kQ4_0, x);
    for (size_t b = 0; b < x.size() / kQK; ++b) {
      float amax = 0;
      for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[b * kQK + j]));
      // Step amax/8; the side opposite the extreme value clamps at +7 steps, so the worst
      // case is one whole step, plus the fp16 rounding of the scale.
      const float bound = amax / 8 + amax * (1.0f / 512);
      for (int j = 0; j < kQK; ++j) {
        ASSERT_LE(std::fabs(y[b * kQK + j] - x[b * kQK + j]), bound) << b << " " << j;
      }
    }
    // On average much better than the worst case.
    double sum_sq = 0, sum_err = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      sum_sq += double(x[i]) * x[i];
      sum_err += double(y[i] - x[i]) * (y[i] - x[i]);
    }
    EXPECT_LT(sum_err / sum_sq, 0.02);
  }
}

TEST(QuantTest, ExtremeValueIsExactInQ4_0) {
  // The largest-magnitude value maps to -8 exactly (up to fp16 rounding of its scale).
  std::vector<float> x(32, 0.5f);
  x[5] = -4.0f;
  auto y = RoundTrip(GgmlType::kQ4_0, x);
  EXPECT_EQ(y[5], -4.0f);
}

// Expected bytes were computed independently (Python, float32 emulation) from ggml's reference
// formulas: Q8_0 d = amax/127, q = roundf(x * (1/d)); Q4_0 d = max/-8, q = min(15, (int8)(x/d
// + 8.5)).
TEST(QuantTest, Q8_0KnownBlock) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j)
    x[j] = static_cast<float>((j - 16) * 0.25 + (j % 3 == 0 ? 0.1 : 0.0));
  uint8_t block[34];
  QuantizeRow(GgmlType::kQ8_0, x.data(), block, 32);
  EXPECT_EQ(block[0] | (block[1] << 8), 0x27DD);
  const int8_t expected[32] = {-127, -122, -114, -103, -98, -90, -78, -73, -65, -54, -49,
                               -41,  -29,  -24,  -16,  -5,  0,   8,   20,  24,  33,  44,
                               49,   57,   68,   73,   81,  93,  98,  106, 117, 122};
  for (int j = 0; j < 32; ++j) EXPECT_EQ(static_cast<int8_t>(block[2 + j]), expected[j]) << j;
  float y[32];
  DequantizeRow(GgmlType::kQ8_0, block, y, 32);
  const float d = Fp16ToFp32(0x27DD);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], expected[j] * d);
}

TEST(QuantTest, Q4_0KnownBlock) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(std::sin(j * 0.7) * 3);
  uint8_t block[18];
  QuantizeRow(GgmlType::kQ4_0, x.data(), block, 32);
  EXPECT_EQ(block[0] | (block[1] << 8), 0xB5F5);
  const uint8_t expected[16] = {0xf8, 0xd3, 0x80, 0x31, 0x05, 0x1b, 0x6f, 0xbf,
                                0xfd, 0xf8, 0xd3, 0x80, 0x31, 0x05, 0x1b, 0x6f};
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block[2 + j], expected[j]) << j;
  float y[32];
  DequantizeRow(GgmlType::kQ4_0, block, y, 32);
  const float d = Fp16ToFp32(0xB5F5);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], ((expected[j] & 0xF) - 8) * d);
    EXPECT_EQ(y[j + 16], ((expected[j] >> 4) - 8) * d);
  }
}

TEST(QuantTest, ZeroBlocks) {
  std::vector<float> x(64, 0.0f);
  uint8_t q8[68], q4[36];
  QuantizeRow(GgmlType::kQ8_0, x.data(), q8, 64);
  QuantizeRow(GgmlType::kQ4_0, x.data(), q4, 64);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(q8[b * 34], 0);
    EXPECT_EQ(q8[b * 34 + 1], 0);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q8[b * 34 + 2 + j], 0);
    // ggml computes d = max / -8 = -0.0 here, so the scale is negative zero.
    EXPECT_EQ(q4[b * 18], 0x00);
    EXPECT_EQ(q4[b * 18 + 1], 0x80);
    for (int j = 0; j < 16; ++j) EXPECT_EQ(q4[b * 18 + 2 + j], 0x88);
  }
  EXPECT_EQ(RoundTrip(GgmlType::kQ8_0, x), x);
  EXPECT_EQ(RoundTrip(GgmlType::kQ4_0, x), x);
}

TEST(QuantTest, NonFiniteInputsDoNotCrash) {
  std::vector<float> x(32, 1.0f);
  x[3] = std::numeric_limits<float>::infinity();
  x[7] = std::nanf("");
  x[9] = 1e-40f;  // subnormal
  for (GgmlType t : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    RoundTrip(t, x);
  }
  std::vector<float> tiny(32, 1e-40f);  // scale underflows and its inverse overflows
  RoundTrip(GgmlType::kQ8_0, tiny);
  RoundTrip(GgmlType::kQ4_0, tiny);
}

TEST(QuantTest, UnalignedBuffers) {
  // Files with general.alignment 1 can put blocks at odd addresses.
  auto x = RandomRow(64, 5, 1.0f);
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                     GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    const int64_t nb = RowBytes(t, 64);
    std::vector<uint8_t> aligned(nb), unaligned(nb + 1);
    QuantizeRow(t, x.data(), aligned.data(), 64);
    QuantizeRow(t, x.data(), unaligned.data() + 1, 64);
    EXPECT_EQ(0, std::memcmp(aligned.data(), unaligned.data() + 1, nb));
    std::vector<float> a(64), b(64);
    DequantizeRow(t, aligned.data(), a.data(), 64);
    DequantizeRow(t, unaligned.data() + 1, b.data(), 64);
    EXPECT_EQ(a, b);
  }
}

}  // namespace
}  // namespace thermocline
