// The elementwise ops against straightforward double-precision formulas.
#include "shared/runtime/ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace thermocline {
namespace {

TEST(OpsTest, RmsNormMatchesFormula) {
  std::vector<float> x = {1, -2, 3, 0.5f}, w = {1, 2, 0.5f, -1}, out(4);
  RmsNorm(x.data(), w.data(), 4, 1e-5f, out.data());
  double ms = (1 + 4 + 9 + 0.25) / 4 + 1e-5;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], w[i] * x[i] / std::sqrt(ms), 1e-6);
}

TEST(OpsTest, RmsNormOfLongOddRowsMatchesFormula) {
  // The sixteen-lane sum, its tail and the pairwise fold: n below, at and past multiples of 16.
  for (int64_t n : {1, 15, 16, 17, 2048, 2053}) {
    std::vector<float> x(n), w(n), out(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = std::sin(0.37f * static_cast<float>(i) + 1.0f) * (1 + i % 7);
      w[i] = 0.5f + 0.01f * static_cast<float>(i % 13);
    }
    RmsNorm(x.data(), w.data(), n, 1e-5f, out.data());
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const double scale = 1 / std::sqrt(ss / n + 1e-5);
    // Each float partial sum of squares is within n * 2^-24 of its value relative (the sum of
    // positive terms), and the rsqrt, the product and w add a few roundings more.
    const double rel = (n + 8) * std::ldexp(1.0, -24);
    for (int64_t i = 0; i < n; ++i) {
      const double want = w[i] * x[i] * scale;
      EXPECT_NEAR(out[i], want, rel * std::abs(want) + 1e-30) << "n " << n << " i " << i;
    }
  }
}

TEST(OpsTest, RopeInTwoStepsIsRopeBitForBitAndPairsNeoxHalves) {
  constexpr int64_t kHeads = 3, kHeadDim = 10, kRopeDim = 8;
  std::vector<float> x(kHeads * kHeadDim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.7f * static_cast<float>(i)) * 3.0f;
  RopeParams plain;
  plain.head_dim = kHeadDim;
  plain.rope_dim = kRopeDim;
  plain.base = 500000.0f;
  RopeParams neox = plain;
  neox.neox = true;
  for (int64_t pos : {0, 1, 7, 4095, 100000}) {
    std::vector<float> cs(kRopeDim), a = x, c = x;
    RopeAngles(plain, pos, cs.data());
    ApplyRope(a.data(), kHeads, plain, cs.data());
    Rope(c.data(), kHeads, kHeadDim, kRopeDim, pos, plain.base);
    EXPECT_EQ(a, c) << "pos " << pos;  // forward.cc relies on it for llama2.c's models

    std::vector<float> n = x;
    RopeAngles(neox, pos, cs.data());
    ApplyRope(n.data(), kHeads, neox, cs.data());
    for (int64_t h = 0; h < kHeads; ++h) {
      const float* in = x.data() + h * kHeadDim;
      const float* out = n.data() + h * kHeadDim;
      for (int64_t j = 0; j < kRopeDim / 2; ++j) {
        // theta in float, as ggml forms it (at position 1e5 a one-ulp frequency would move it
        // by 1e-2 radians); the rotation in double. What is left is the float cos, sin and
        // products: a few ulps of values below 6.
        const float freq =
            1.0f / std::pow(500000.0f, static_cast<float>(2 * j) / static_cast<float>(kRopeDim));
        const double theta = static_cast<float>(pos) * freq;
        const double p0 = in[j], p1 = in[j + kRopeDim / 2];
        EXPECT_NEAR(out[j], p0 * std::cos(theta) - p1 * std::sin(theta), 4e-6) << pos;
        EXPECT_NEAR(out[j + kRopeDim / 2], p0 * std::sin(theta) + p1 * std::cos(theta), 4e-6);
      }
      for (int64_t d = kRopeDim; d < kHeadDim; ++d) EXPECT_EQ(out[d], in[d]);
    }
  }
}

TEST(OpsTest, RopeRotatesPairsByPositionAndLeavesUnrotatedDims) {
  // 2 heads of 6 dims, rotating the first 4 of each.
  std::vector<float> x(12);
  for (int i = 0; i < 12; ++i) x[i] = 0.1f * (i + 1);
  std::vector<float> y = x;
  Rope(y.data(), 2, 6, 4, 7, 10000.0f);
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 2; ++j) {
      double theta = 7 * std::pow(10000.0, -2.0 * j / 4);
      double a = x[h * 6 + 2 * j], b = x[h * 6 + 2 * j + 1];
      EXPECT_NEAR(y[h * 6 + 2 * j], a * std::cos(theta) - b * std::sin(theta), 1e-5);
      EXPECT_NEAR(y[h * 6 + 2 * j + 1], a * std::sin(theta) + b * std::cos(theta), 1e-5);
    }
    EXPECT_EQ(y[h * 6 + 4], x[h * 6 + 4]);
    EXPECT_EQ(y[h * 6 + 5], x[h * 6 + 5]);
  }
  std::vector<float> z = x;
  Rope(z.data(), 2, 6, 4, 0, 10000.0f);
  EXPECT_EQ(z, x);  // position 0 is the identity
}

TEST(OpsTest, SoftmaxSumsToOneAndIsShiftInvariant) {
  std::vector<float> a = {1, 2, 3, 1000}, b = {-999, -998, -997, 0};
  Softmax(a.data(), 4);
  Softmax(b.data(), 4);
  double s = 0;
  for (int i = 0; i < 4; ++i) {
    s += a[i];
    EXPECT_NEAR(a[i], b[i], 1e-6);
  }
  EXPECT_NEAR(s, 1.0, 1e-6);
}

TEST(OpsTest, ReluGatesAreTheConditionalFormulaBitForBit) {
  // Every sign, zero, subnormal, infinity and NaN for the gate and the up value.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float den = std::numeric_limits<float>::denorm_min();
  const std::vector<float> values = {0.0f, -0.0f, den, -den, 1.5f,   -1.5f, 3e38f, -3e38f,
                                     inf,  -inf,  nan, -nan, 1e-30f, -2.0f, 7.0f};
  std::vector<float> gate, up;
  for (float g : values) {
    for (float u : values) {
      gate.push_back(g);
      up.push_back(u);
    }
  }
  std::vector<float> relu = gate, drelu = gate;
  ReluGlu(relu.data(), up.data(), static_cast<int64_t>(gate.size()));
  DreluGlu(drelu.data(), up.data(), static_cast<int64_t>(gate.size()));
  auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
  };
  for (size_t i = 0; i < gate.size(); ++i) {
    const float g = gate[i], u = up[i];
    const float want_relu = g > 0.0f ? g * u : 0.0f;
    const float want_drelu = g > 0.0f && u > 0.0f ? g * u : 0.0f;
    EXPECT_EQ(bits(relu[i]), bits(want_relu)) << g << " * " << u;
    EXPECT_EQ(bits(drelu[i]), bits(want_drelu)) << g << " * " << u;
  }
}

TEST(OpsTest, GatedActivations) {
  std::vector<float> g = {-2, 0, 3}, up = {2, 5, -1};
  std::vector<float> s = g, r = g;
  SwiGlu(s.data(), up.data(), 3);
  ReluGlu(r.data(), up.data(), 3);
  for (int i = 0; i < 3; ++i) {
    double silu = g[i] / (1 + std::exp(-double(g[i])));
    EXPECT_NEAR(s[i], silu * up[i], 1e-6);
    EXPECT_EQ(r[i], g[i] > 0 ? g[i] * up[i] : 0.0f);
  }
}

}  // namespace
}  // namespace thermocline
