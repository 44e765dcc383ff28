// The quantizers of the 32-element legacy blocks (q4_0, q4_1, q5_0, q5_1; shared/gguf/quant.cc)
// against the format's own error bound, checked through the existing bit-exact dequantizer, on
// the rows of the shared F32 model (../shared/models/quants/base-f32.gguf) and on random rows
// with edge-case blocks. No llama.cpp file of q4_1 / q5_0 / q5_1 exists to compare bytes with
// (q4_0 has one: tests/integration/quantize_test.cc), so this is the check for those three.
//
// The bound, per block of 32 values x with dequantized values y:
// * With a min (q4_1: N = 15, q5_1: N = 31): ggml takes d = (max - min) / N and the index
//   q = floor((x - min) / d + 1/2) in [0, N], so x lies within d/2 of d q + min. The file keeps
//   d16 = fp16(d) and m16 = fp16(min) and y = d16 q + m16, which adds at most
//   q |d - d16| + |min - m16| <= N |d - d16| + |min - m16|. Hence
//   |x - y| <= d/2 + N |d - d16| + |min - m16| (+ f32 rounding, below 8 ulp of |min| + N d).
//   The min and max elements get indices 0 and N exactly: y = m16 and y = d16 N + m16.
// * Without a min (q4_0: H = 8, q5_0: H = 16): ggml takes the value of largest magnitude `max`
//   (the first one on a tie) and d = max / -H, and the index q = floor(x / d + H + 1/2) capped at
//   2H - 1, i.e. x / d rounded to an integer in [-H, H - 1]. Since |x / d| <= H only a value
//   with x / d > H - 1/2 (the opposite sign of `max`, near its magnitude) is capped, at
//   (x / d - (H - 1)) |d| <= |d| from x; every other value is within |d| / 2. The fp16 scale
//   adds H |d - d16|. `max` itself gets index 0 (value -H), so y = -H d16, off from x only by
//   the fp16 rounding of d.
// Each stored d16 / m16 must also be exactly fp16 of ggml's f32 d / min, recomputed here.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/gguf.h"
#include "shared/gguf/quant.h"
#include "shared/util/fp16.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

struct Format {
  GgmlType type;
  bool has_min;
  int bits;  // 4 or 5
};
constexpr Format kFormats[] = {{GgmlType::kQ4_0, false, 4},
                               {GgmlType::kQ4_1, true, 4},
                               {GgmlType::kQ5_0, false, 5},
                               {GgmlType::kQ5_1, true, 5}};

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}
float RoundToHalf(float x) { return Fp16ToFp32(Fp32ToFp16(x)); }

// Checks one row of x against its quantized bytes (ASSERTs return from here only; callers test
// HasFatalFailure()).
void CheckRow(const Format& f, const float* x, int64_t n, const std::string& what) {
  const int64_t block_bytes = TypeTraits(f.type).block_bytes;
  std::vector<uint8_t> q(static_cast<size_t>(RowBytes(f.type, n)));
  QuantizeRow(f.type, x, q.data(), n);
  std::vector<float> y(static_cast<size_t>(n));
  DequantizeRow(f.type, q.data(), y.data(), n);
  const float u = std::numeric_limits<float>::epsilon() / 2;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    const float* yb = y.data() + b * kQK;
    const uint8_t* block = q.data() + b * block_bytes;
    const float d16 = Half(block);
    SCOPED_TRACE(what + " block " + std::to_string(b));
    if (f.has_min) {
      const int big_n = (1 << f.bits) - 1;
      int imin = 0, imax = 0;
      for (int j = 1; j < kQK; ++j) {
        if (xb[j] < xb[imin]) imin = j;
        if (xb[j] > xb[imax]) imax = j;
      }
      const float min = xb[imin], max = xb[imax];
      const float d = (max - min) / static_cast<float>(big_n);
      const float m16 = Half(block + 2);
      ASSERT_EQ(d16, RoundToHalf(d));
      ASSERT_EQ(m16, RoundToHalf(min));
      const float bound = d / 2 + big_n * std::fabs(d - d16) + std::fabs(min - m16) +
                          8 * u * (std::fabs(min) + big_n * d);
      for (int j = 0; j < kQK; ++j) {
        ASSERT_LE(std::fabs(xb[j] - yb[j]), bound) << "j=" << j << " x=" << xb[j];
      }
      EXPECT_EQ(yb[imin], m16);
      EXPECT_EQ(yb[imax], d16 * static_cast<float>(big_n) + m16);
    } else {
      const int h = 1 << (f.bits - 1);
      int iext = 0;
      for (int j = 1; j < kQK; ++j) {
        if (std::fabs(xb[j]) > std::fabs(xb[iext])) iext = j;  // the first on a tie, as ggml
      }
      const float max = xb[iext];
      const float d = max / static_cast<float>(-h);
      ASSERT_EQ(d16, RoundToHalf(d));
      const float ad = std::fabs(d);
      for (int j = 0; j < kQK; ++j) {
        const double t = d != 0.0f ? static_cast<double>(xb[j]) / d : 0.0;
        const float steps = static_cast<float>(std::max(0.5, t - (h - 1)));
        const float bound =
            ad * steps + h * std::fabs(d - d16) + 8 * u * (std::fabs(max) + std::fabs(xb[j]));
        ASSERT_LE(std::fabs(xb[j] - yb[j]), bound) << "j=" << j << " x=" << xb[j];
      }
      EXPECT_EQ(yb[iext], static_cast<float>(-h) * d16);
      EXPECT_LE(std::fabs(yb[iext] - max), h * std::fabs(d - d16));
    }
  }
}

TEST(LegacyQuantTest, RealRowsWithinTheFormatBound) {
  auto file = GgufFile::Open(testing::ModelPath("quants/base-f32.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  for (const Format& f : kFormats) {
    int64_t blocks = 0;
    for (const GgufTensorInfo& t : (*file)->tensors()) {
      if (t.type != GgmlType::kF32 || t.ne.size() < 2 || t.ne[0] % kQK != 0) continue;
      const int64_t cols = t.ne[0], rows = t.n_elements / cols;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> row(static_cast<size_t>(cols));
        std::memcpy(row.data(), t.data + r * cols * 4, static_cast<size_t>(cols) * 4);
        blocks += cols / kQK;
        CheckRow(f, row.data(), cols,
                 std::string(TypeTraits(f.type).name) + " " + t.name + " row " + std::to_string(r));
        if (HasFatalFailure()) return;
      }
    }
    // Every matrix of the model: 4 layers of 7 matrices, token_embd and output.
    EXPECT_GT(blocks, 100000) << TypeTraits(f.type).name;
  }
}

// Random rows of very different magnitudes, and blocks made to hit each edge of the formulas.
std::vector<float> EdgeRows() {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-8.0f, 8.0f);
  std::vector<float> x;
  for (int b = 0; b < 4000; ++b) {
    const float s = std::exp(log_scale(rng));
    for (int j = 0; j < kQK; ++j) x.push_back(normal(rng) * s);
  }
  auto block = [&x](auto value) {
    for (int j = 0; j < kQK; ++j) x.push_back(value(j));
  };
  block([](int) { return 0.0f; });                                   // all zero
  block([](int) { return -0.0f; });                                  // all negative zero
  block([](int) { return 0.3f; });                                   // all equal, positive
  block([](int) { return -7.25f; });                                 // all equal, negative
  block([](int j) { return j == 9 ? 1e4f : 0.01f * j; });            // one huge value
  block([](int j) { return j == 3 ? -5.0f : std::sin(j * 1.0f); });  // negative max magnitude
  block([](int j) { return j == 30 ? 5.0f : std::sin(j * 1.0f); });  // positive max magnitude
  // Both signs at the largest magnitude: the first wins, the other is capped (no-min types).
  block([](int j) { return j == 4 ? -2.0f : j == 20 ? 2.0f : 0.1f * (j % 5); });
  block([](int j) { return j == 4 ? 2.0f : j == 20 ? -2.0f : 0.1f * (j % 5); });
  block([](int j) { return 100.0f + j; });              // all positive: the min is far from zero
  block([](int j) { return j % 2 ? 1e-6f : -1e-6f; });  // tiny: fp16 scale is subnormal
  return x;
}

TEST(LegacyQuantTest, RandomAndEdgeBlocksWithinTheFormatBound) {
  const std::vector<float> x = EdgeRows();
  for (const Format& f : kFormats) {
    CheckRow(f, x.data(), static_cast<int64_t>(x.size()), std::string(TypeTraits(f.type).name));
  }
}

TEST(LegacyQuantTest, ConstantBlocksAreExactUpToHalfRounding) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(TypeTraits(f.type).name);
    for (float c : {0.0f, 0.3f, -7.25f, 1000.0f}) {
      std::vector<float> x(kQK, c), y(kQK);
      std::vector<uint8_t> q(static_cast<size_t>(TypeTraits(f.type).block_bytes));
      QuantizeRow(f.type, x.data(), q.data(), kQK);
      DequantizeRow(f.type, q.data(), y.data(), kQK);
      // With a min the block is its min (d = 0); without, every value is `max` (index 0).
      const float want = f.has_min ? RoundToHalf(c)
                                   : -static_cast<float>(1 << (f.bits - 1)) *
                                         RoundToHalf(c / -static_cast<float>(1 << (f.bits - 1)));
      for (int j = 0; j < kQK; ++j) EXPECT_EQ(y[j], want) << c << " j=" << j;
    }
  }
}

// Nibble and high-bit placement, decoded here from the bytes (not through DequantizeRow): a ramp
// whose indices are known from the formula. q5_1 on 0..31: min 0, d = 1, index j at element j.
TEST(LegacyQuantTest, Q5_1RampLayout) {
  std::vector<float> x(kQK);
  for (int j = 0; j < kQK; ++j) x[j] = static_cast<float>(j);
  uint8_t b[24];
  QuantizeRow(GgmlType::kQ5_1, x.data(), b, kQK);
  EXPECT_EQ(Half(b), 1.0f);
  EXPECT_EQ(Half(b + 2), 0.0f);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  for (int j = 0; j < kQK; ++j) {
    const int low = j < 16 ? (b[8 + j] & 0x0F) : (b[8 + j - 16] >> 4);
    EXPECT_EQ(low | static_cast<int>(((qh >> j) & 1) << 4), j) << j;
  }
  // q5_0 on -16..15: the largest magnitude is -16, d = 1, index j.
  for (int j = 0; j < kQK; ++j) x[j] = static_cast<float>(j - 16);
  uint8_t c[22];
  QuantizeRow(GgmlType::kQ5_0, x.data(), c, kQK);
  EXPECT_EQ(Half(c), 1.0f);
  std::memcpy(&qh, c + 2, 4);
  for (int j = 0; j < kQK; ++j) {
    const int low = j < 16 ? (c[6 + j] & 0x0F) : (c[6 + j - 16] >> 4);
    EXPECT_EQ(low | static_cast<int>(((qh >> j) & 1) << 4), j) << j;
  }
  // q4_1 on 0..15 twice: min 0, d = 1.
  for (int j = 0; j < kQK; ++j) x[j] = static_cast<float>(j % 16);
  uint8_t e[20];
  QuantizeRow(GgmlType::kQ4_1, x.data(), e, kQK);
  EXPECT_EQ(Half(e), 1.0f);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(e[4 + j], j | (j << 4)) << j;
}

TEST(LegacyQuantTest, NonFiniteInputsDoNotCrash) {
  std::vector<float> x(kQK, 1.0f);
  x[3] = std::numeric_limits<float>::infinity();
  x[7] = std::nanf("");
  x[9] = -std::numeric_limits<float>::infinity();
  std::vector<float> huge(kQK, 3e38f);
  huge[1] = -3e38f;  // max - min overflows to infinity
  for (const Format& f : kFormats) {
    std::vector<uint8_t> q(static_cast<size_t>(TypeTraits(f.type).block_bytes));
    std::vector<float> y(kQK);
    QuantizeRow(f.type, x.data(), q.data(), kQK);
    DequantizeRow(f.type, q.data(), y.data(), kQK);
    QuantizeRow(f.type, huge.data(), q.data(), kQK);
    DequantizeRow(f.type, q.data(), y.data(), kQK);
  }
}

}  // namespace
}  // namespace thermocline
