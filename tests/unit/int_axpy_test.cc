// IntAxpyRows (kernels/matmul.h), the integer axpy of TEAL's Q4_0 products, in every kernel
// family this CPU runs: against a double-precision sum within the bound its 8-bit rounding of
// the coefficients allows, exact where the coefficients fall on the rounding grid, and the same
// bits as the portable kernel, over odd widths (tails of the 8-block gathers and of the block
// pairs), id lists of 0, 1, 15, 16, 17 and more entries (groups of 16 and a short last one),
// repeated and unsorted ids.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/kernels/matmul.h"
#include "shared/kernels/matmul_kernels.h"
#include "tests/kernel_families.h"

namespace thermocline {
namespace {

constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);
using matmul_internal::kIntAxpyGroupRows;

class IntAxpyTest : public testing::KernelFamilyTest {};

struct Q4Rows {
  std::vector<uint8_t> bytes;
  MatrixView view;
  float Scale(int64_t r, int64_t b) const {
    uint16_t d;
    std::memcpy(&d, bytes.data() + r * view.row_bytes + b * kBlockBytes, 2);
    return Fp16ToFp32(d);
  }
  int Nibble(int64_t r, int64_t c) const {
    const uint8_t u =
        bytes[r * view.row_bytes + (c / kQK) * kBlockBytes + offsetof(BlockQ4_0, qs) + c % 16];
    return (c % kQK) < 16 ? (u & 0x0F) : (u >> 4);
  }
};

// Random nibbles; finite scales of either sign and magnitudes 2^-4..2^3 that differ by row and
// block.
Q4Rows RandomRows(int64_t rows, int64_t cols, std::mt19937& rng) {
  Q4Rows m;
  const int64_t rb = RowBytes(GgmlType::kQ4_0, cols);
  m.bytes.resize(rows * rb);
  std::uniform_int_distribution<int> byte(0, 255), exp(-4, 3);
  std::uniform_real_distribution<float> unit(0.25f, 1.0f);
  for (uint8_t& v : m.bytes) v = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, exp(rng));
    for (int64_t b = 0; b < cols / kQK; ++b) {
      const uint16_t d = Fp32ToFp16(magnitude * unit(rng) * (byte(rng) % 2 ? 1.0f : -1.0f));
      std::memcpy(m.bytes.data() + r * rb + b * kBlockBytes, &d, 2);
    }
  }
  m.view = MatrixView{GgmlType::kQ4_0, rows, cols, m.bytes.data(), rb};
  return m;
}

std::vector<float> Kernel(const Q4Rows& m, const std::vector<int32_t>& ids,
                          const std::vector<float>& coeffs, const std::vector<float>& y0) {
  std::vector<float> y = y0;
  IntAxpyRows(m.view, ids.data(), coeffs.data(), static_cast<int64_t>(ids.size()), y.data());
  return y;
}

std::vector<float> RunPortable(const Q4Rows& m, const std::vector<int32_t>& ids,
                               const std::vector<float>& coeffs, const std::vector<float>& y0) {
  std::vector<float> y = y0;
  matmul_internal::IntAxpyQ4_0Portable(
      matmul_internal::RowSource{m.view.data, m.view.row_bytes, ids.data()}, coeffs.data(),
      static_cast<int64_t>(ids.size()), m.view.cols, y.data());
  return y;
}

std::vector<std::vector<int32_t>> IdLists(int64_t rows, std::mt19937& rng) {
  std::vector<int32_t> all(rows);
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  std::vector<std::vector<int32_t>> lists = {{}, {static_cast<int32_t>(rows - 1)}, all, shuffled};
  for (int64_t n : {15, 16, 17, 33, 50}) {
    std::vector<int32_t> ids(n);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(rows - 1));
    for (int32_t& id : ids) id = pick(rng);  // repeats allowed: a row added twice counts twice
    lists.push_back(ids);
  }
  return lists;
}

TEST(IntAxpyTypesTest, Q4_0Only) {
  EXPECT_TRUE(HasIntAxpy(GgmlType::kQ4_0));
  for (GgmlType t : testing::kWeightTypes) {
    if (t != GgmlType::kQ4_0) {
      EXPECT_FALSE(HasIntAxpy(t)) << TypeTraits(t).name;
    }
  }
}

TEST_P(IntAxpyTest, MatchesDoubleReferenceWithinRoundingBound) {
  std::mt19937 rng(11);
  // 1, 2, 3, 8, 9 and 65 blocks: one block pair short, the 8-block gathers' tails.
  for (int64_t cols : {32, 64, 96, 256, 288, 2080}) {
    const int64_t rows = 70;
    const Q4Rows m = RandomRows(rows, cols, rng);
    for (const std::vector<int32_t>& ids : IdLists(rows, rng)) {
      const int64_t n = static_cast<int64_t>(ids.size());
      std::vector<float> coeffs = testing::NormalVector(n, rng);
      for (int64_t i = 0; i < n; i += 7) coeffs[i] *= 30.0f;  // a spread the rounding must carry
      const std::vector<float> y0 = testing::NormalVector(cols, rng);
      const std::vector<float> y = Kernel(m, ids, coeffs, y0);
      const int64_t groups = (n + kIntAxpyGroupRows - 1) / kIntAxpyGroupRows;
      const double u = 0x1p-24;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t b = c / kQK;
        // No group's largest |a_i| exceeds the largest over all ids.
        double amax = 0;
        for (int64_t i = 0; i < n; ++i) {
          amax = std::max(amax, std::fabs(static_cast<double>(coeffs[i] * m.Scale(ids[i], b))));
        }
        double ref = y0[c], rounding = 0, magnitude = std::fabs(y0[c]);
        for (int64_t i = 0; i < n; ++i) {
          const int w = m.Nibble(ids[i], c) - 8;
          const double a = static_cast<double>(coeffs[i]) * m.Scale(ids[i], b);
          ref += a * w;
          rounding += amax / 254 * std::abs(w);
          magnitude += std::fabs(a * w);
        }
        // Each coefficient's 8-bit rounding (half a step of s <= amax / 127, and s and 1 / s
        // each rounded once), then one f32 rounding of a_i and one fused add per group.
        const double bound =
            rounding * (1 + 1e-4) + 4 * (groups + 2) * u * (magnitude + rounding) + 1e-30;
        ASSERT_LE(std::fabs(y[c] - ref), bound)
            << cols << " cols, " << n << " ids, column " << c << " got " << y[c] << " want " << ref;
      }
    }
  }
}

// Coefficients that are multiples of their group's step give no rounding at all: q_i is the
// integer itself, every group's sum an integer times the step, and y the exact sum (all of
// it fits f32's 24 bits): what the lanes, the pairs of rows and the -8 offset must give.
TEST_P(IntAxpyTest, ExactOnTheRoundingGrid) {
  std::mt19937 rng(12);
  for (int64_t cols : {32, 96, 288, 2080}) {
    const int64_t rows = 40;
    Q4Rows m = RandomRows(rows, cols, rng);
    const uint16_t eighth = Fp32ToFp16(0.125f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < cols / kQK; ++b) {
        std::memcpy(m.bytes.data() + r * m.view.row_bytes + b * kBlockBytes, &eighth, 2);
      }
    }
    for (const std::vector<int32_t>& ids : IdLists(rows, rng)) {
      const int64_t n = static_cast<int64_t>(ids.size());
      std::uniform_int_distribution<int> k(-127, 127);
      std::vector<int> ks(n);
      for (int64_t i = 0; i < n; ++i) ks[i] = i % kIntAxpyGroupRows == 0 ? 127 : k(rng);
      std::vector<float> coeffs(n);
      for (int64_t i = 0; i < n; ++i) coeffs[i] = std::ldexp(static_cast<float>(ks[i]), -4);
      const std::vector<float> y0(cols, 0.0f);
      const std::vector<float> y = Kernel(m, ids, coeffs, y0);
      for (int64_t c = 0; c < cols; ++c) {
        int64_t sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += ks[i] * (m.Nibble(ids[i], c) - 8);
        ASSERT_EQ(y[c], std::ldexp(static_cast<float>(sum), -7))
            << cols << " cols, " << n << " ids, column " << c;
      }
    }
  }
}

TEST_P(IntAxpyTest, SameBitsAsPortable) {
  std::mt19937 rng(13);
  // 1..9 blocks: every short chunk of 8 blocks and half-chunk of 4; 65 and 172: long rows.
  for (int64_t cols : {32, 64, 96, 128, 160, 192, 224, 256, 288, 2080, 5504}) {
    const int64_t rows = 90;
    const Q4Rows m = RandomRows(rows, cols, rng);
    for (const std::vector<int32_t>& ids : IdLists(rows, rng)) {
      std::vector<float> coeffs = testing::NormalVector(static_cast<int64_t>(ids.size()), rng);
      if (!coeffs.empty()) coeffs[0] = 0.0f;  // a zero coefficient among nonzero ones
      const std::vector<float> y0 = testing::NormalVector(cols, rng);
      EXPECT_TRUE(testing::SameBits(Kernel(m, ids, coeffs, y0), RunPortable(m, ids, coeffs, y0)))
          << GetParam().name << " " << cols << " cols, " << ids.size() << " ids";
    }
  }
}

// Values no model should produce, but a corrupt file or a diverged activation can: every family
// must still give the portable kernel's bits, and a NaN coefficient must drop only its own row
// (its q is 0 and it is left out of the group's maximum), wherever it sits in the group.
TEST_P(IntAxpyTest, SpecialValuesSameBitsAsPortable) {
  std::mt19937 rng(14);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t cols : {32, 160, 288}) {
    const int64_t rows = 40;
    Q4Rows m = RandomRows(rows, cols, rng);
    // fp16 scales: zero, a subnormal, the largest finite, infinity, NaN.
    const uint16_t specials[] = {0x0000, 0x0001, 0x7BFF, 0x7C00, 0x7E00};
    for (int64_t r = 0; r < rows; r += 3) {
      const uint16_t d = specials[(r / 3) % 5];
      std::memcpy(m.bytes.data() + r * m.view.row_bytes + ((r / 3) % (cols / kQK)) * kBlockBytes,
                  &d, 2);
    }
    std::vector<int32_t> ids(rows);
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<float> coeffs = testing::NormalVector(rows, rng);
    const float special_coeffs[] = {inf, -inf, 1e-38f, 3e38f, 0.0f, -0.0f};
    for (int64_t i = 1; i < rows; i += 5) coeffs[i] = special_coeffs[(i / 5) % 6];
    const std::vector<float> y0 = testing::NormalVector(cols, rng);
    EXPECT_TRUE(testing::SameBits(Kernel(m, ids, coeffs, y0), RunPortable(m, ids, coeffs, y0)))
        << GetParam().name << " " << cols << " cols";
  }
  // A NaN coefficient at each position of a group: the same bits as a zero there.
  for (int64_t cols : {32, 288}) {
    const int64_t rows = kIntAxpyGroupRows;
    const Q4Rows m = RandomRows(rows, cols, rng);
    std::vector<int32_t> ids(rows);
    std::iota(ids.begin(), ids.end(), 0);
    const std::vector<float> y0 = testing::NormalVector(cols, rng);
    for (int64_t at = 0; at < rows; ++at) {
      std::vector<float> coeffs = testing::NormalVector(rows, rng);
      coeffs[at] = 0.0f;
      const std::vector<float> zero = Kernel(m, ids, coeffs, y0);
      coeffs[at] = nan;
      EXPECT_TRUE(testing::SameBits(Kernel(m, ids, coeffs, y0), zero))
          << GetParam().name << " " << cols << " cols, NaN at " << at;
      EXPECT_TRUE(testing::SameBits(RunPortable(m, ids, coeffs, y0), zero)) << "portable, " << at;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, IntAxpyTest, ::testing::ValuesIn(testing::kKernelFamilies),
                         testing::KernelFamilyName);

}  // namespace
}  // namespace thermocline
