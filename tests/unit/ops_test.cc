// The elementwise ops against straightforward double-precision formulas.
#include "shared/runtime/ops.h"

#include <cmath>
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
