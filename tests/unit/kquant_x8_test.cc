// Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS in the 8-row interleaved layouts (shared/gguf/q3_kx8.h,
// q4_kx8.h, q6_kx8.h, iq4_xsx8.h): the copy gives every row back byte for byte, MatMul over it
// matches a double-precision reference and the row-layout kernel within bounds derived below, its
// kernel families agree bit for bit, and its results do not depend on threads, token batching or
// row ranges. The sparse paths keep reading the row layout.
//
// The bounds. Both layouts multiply the same operands: K-quant weights against Q8_K-rounded
// activations (QuantizeRowQ8_K). Per row and 256-column super-block the kernels form exact int32
// sums: for Q4_K / Q5_K I = sum_s sc_s * sum_{l in s} q_l xq_l and M = sum_s mn_s * sum xq_l,
// the block's value d xd I - dmin xd M (k = 2 terms); for Q6_K I = sum_s sc_s * sum_{l in s}
// (q_l - 32) xq_l, the value d xd I (k = 1), and for Q3_K (q_l - 4) and IQ4_XS the IQ4_NL value
// of q_l the same way. The interleaved kernel adds the k nb terms (nb = cols / 256) with one FMA
// each into one f32 accumulator after rounding fl(d * xd) and fl(I) (|I| may pass 2^24): |y - S| <=
// (k nb + 2) u P to first order (u = 2^-24), S the exact sum, P the sum of the terms' magnitudes,
// at most the sum over elements of |d sc q xd xq| (+ |dmin mn xd xq|), which the test computes.
// Written with FLT_EPSILON = 2u and room for second order: (k nb / 2 + 2) FLT_EPSILON P. The AVX2
// row kernels keep 8 lanes per row (each lane's partial sum rounded once at most in its conversion,
// k nb FMAs after the rounding of fl(d * xd)) and add them in a 3-level tree: (k nb + 5) u P; the
// portable row kernel rounds fl(d xd), fl(I), the product and the sum: (k nb + 3) u P. So the
// layouts differ by at most (2 k nb + 7) u P, tested as (k nb + 4) FLT_EPSILON P. A sub-block's
// scale or min taken from the wrong row or sub-block moves y by about P / (16 nb), orders of
// magnitude above these bounds for every shape tested (nb <= 17).

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/interleaved8.h"
#include "shared/gguf/q4_kx8.h"
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

constexpr int64_t kRows[] = {1, 7, 8, 9, 33};
constexpr int64_t kCols[] = {256, 512, 4096 + 256};

using KMatrix = testing::InterleavedMatrix;

// Rows quantized by ggml's reference quantizer of `type`, or (random_bytes) arbitrary bytes,
// which exercise every bit of the layouts (Q4_K's 6-bit scale packing among them).
KMatrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed,
                   bool random_bytes = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  KMatrix m;
  const int64_t row_bytes = RowBytes(type, cols);
  std::vector<float> f(cols);
  m.rows.resize(rows * row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.rows.data() + r * row_bytes;
    if (random_bytes) {
      for (int64_t i = 0; i < row_bytes; ++i) row[i] = static_cast<uint8_t>(rng());
      continue;
    }
    // Rows of different magnitudes, so that a row mix-up cannot hide inside the tolerance; a
    // mean offset gives Q4_K's mins work to do.
    const float scale = 0.5f + static_cast<float>(r % 5);
    for (float& v : f) v = scale * (dist(rng) + 0.3f);
    QuantizeRow(type, f.data(), row, cols);
  }
  testing::AddInterleavedCopy(type, rows, cols, m);
  return m;
}

std::vector<float> Activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// The exact product of one row with the Q8_K-rounded activations, in double (every term
// d * sc * q * xd * xq fits a double's mantissa), and P, the sum of the terms' magnitudes.
// kHigh: Q5_K (block_q5_K: d, dmin, scales[12], qh[32], qs[128]), else Q4_K (no qh).
template <bool kHigh>
void ReferenceQ45_K(const uint8_t* row, const uint8_t* q8k, int64_t cols, double* ref, double* p) {
  *ref = 0;
  *p = 0;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const uint8_t* w = row + b * (kHigh ? 176 : 144);
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
      const uint8_t v = w[(kHigh ? 48 : 16) + 32 * (e / 64) + e % 32];
      int q = (e / 32) % 2 ? v >> 4 : v & 0x0F;
      if (kHigh) q |= ((w[16 + e % 32] >> (e / 32)) & 1) << 4;
      const double a = d * sc * q * xd * xq[e], c = dmin * mn * xd * xq[e];
      *ref += a - c;
      *p += std::fabs(a) + std::fabs(c);
    }
  }
}

void ReferenceQ6_K(const uint8_t* row, const uint8_t* q8k, int64_t cols, double* ref, double* p) {
  *ref = 0;
  *p = 0;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const uint8_t* w = row + b * 210;  // block_q6_K: ql[128], qh[64], int8 scales[16], d
    const uint8_t* x = q8k + b * kQ8KBlockBytes;
    uint16_t dh;
    std::memcpy(&dh, w + 208, 2);
    float xd;
    std::memcpy(&xd, x, 4);
    const double d = Fp16ToFp32(dh);
    const int8_t* xq = reinterpret_cast<const int8_t*>(x + 4);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, ep = e % 128;
      const int low = ep / 64 ? w[64 * h + ep % 64] >> 4 : w[64 * h + ep % 64] & 0x0F;
      const int high = (w[128 + 32 * h + ep % 32] >> (2 * (ep / 32))) & 3;
      const int q = (low | (high << 4)) - 32;
      const double a = d * static_cast<int8_t>(w[192 + e / 16]) * q * xd * xq[e];
      *ref += a;
      *p += std::fabs(a);
    }
  }
}

// block_q3_K: hmask[32], qs[64], scales[12], fp16 d; element 128h + 32j + l has its low bits
// at bit 2j of qs[32h + l] and its third bit at bit 4h + j of hmask[l] (value q - 4); sub-block
// s's 6-bit scale is the low nibble of byte s (s < 8) or the high one of byte s - 8, with two
// high bits at bit 2 (s / 4) of byte 8 + s % 4, minus 32 (ggml's dequantize_row_q3_K).
void ReferenceQ3_K(const uint8_t* row, const uint8_t* q8k, int64_t cols, double* ref, double* p) {
  *ref = 0;
  *p = 0;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const uint8_t* w = row + b * 110;
    const uint8_t* x = q8k + b * kQ8KBlockBytes;
    uint16_t dh;
    std::memcpy(&dh, w + 108, 2);
    float xd;
    std::memcpy(&xd, x, 4);
    const double d = Fp16ToFp32(dh);
    const uint8_t* sc = w + 96;
    const int8_t* xq = reinterpret_cast<const int8_t*>(x + 4);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, j = (e % 128) / 32, l = e % 32, s = e / 16;
      const int low = s < 8 ? sc[s] & 0x0F : sc[s - 8] >> 4;
      const int scale = (low | (((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4)) - 32;
      const int q = ((w[32 + 32 * h + l] >> (2 * j)) & 3) | (((w[l] >> (4 * h + j)) & 1) << 2);
      const double a = d * scale * (q - 4) * xd * xq[e];
      *ref += a;
      *p += std::fabs(a);
    }
  }
}

// block_iq4_xs: fp16 d, uint16 scales_h, scales_l[4], qs[128]; sub-block s's scale is
// (nibble s of scales_l | bits 2s, 2s + 1 of scales_h << 4) - 32, its quants the low nibbles of
// qs[16s..16s+15] (elements 32s..) and their high nibbles (elements 32s + 16..).
void ReferenceIq4_XS(const uint8_t* row, const uint8_t* q8k, int64_t cols, double* ref, double* p) {
  *ref = 0;
  *p = 0;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const uint8_t* w = row + b * 136;
    const uint8_t* x = q8k + b * kQ8KBlockBytes;
    uint16_t dh, sh;
    std::memcpy(&dh, w, 2);
    std::memcpy(&sh, w + 2, 2);
    float xd;
    std::memcpy(&xd, x, 4);
    const double d = Fp16ToFp32(dh);
    const int8_t* xq = reinterpret_cast<const int8_t*>(x + 4);
    for (int e = 0; e < kQK_K; ++e) {
      const int s = e / 32, i = e % 32;
      const int sc = (((w[4 + s / 2] >> (4 * (s % 2))) & 0x0F) | (((sh >> (2 * s)) & 3) << 4)) - 32;
      const uint8_t q = w[8 + 16 * s + i % 16];
      const int value = kIq4nlValues[i < 16 ? q & 0x0F : q >> 4];
      const double a = d * sc * value * xd * xq[e];
      *ref += a;
      *p += std::fabs(a);
    }
  }
}

struct KType {
  GgmlType type;
  const char* name;
  int terms;                // f32 terms per row and super-block (k above)
  int64_t row_block_bytes;  // per row and super-block, in the interleaved layout
  void (*reference)(const uint8_t*, const uint8_t*, int64_t, double*, double*);
};
// Q4_K's and Q5_K's scales and mins, unpacked to bytes, make 148 bytes of 144 and 180 of 176;
// Q6_K's are bytes already.
constexpr KType kTypes[] = {{GgmlType::kQ4_K, "q4_K", 2, 148, &ReferenceQ45_K<false>},
                            {GgmlType::kQ5_K, "q5_K", 2, 180, &ReferenceQ45_K<true>},
                            {GgmlType::kQ6_K, "q6_K", 1, 210, &ReferenceQ6_K},
                            {GgmlType::kIQ4_XS, "iq4_xs", 1, 136, &ReferenceIq4_XS},
                            {GgmlType::kQ3_K, "q3_K", 1, 110, &ReferenceQ3_K}};

std::string Shape(const KType& kt, int64_t rows, int64_t cols) {
  return absl::StrCat(kt.name, " ", rows, "x", cols);
}

TEST(KQuantX8LayoutTest, EveryRowComesBackByteForByte) {
  for (const KType& kt : kTypes) {
    for (bool random_bytes : {false, true}) {
      for (int64_t rows : kRows) {
        for (int64_t cols : kCols) {
          const KMatrix m = MakeMatrix(kt.type, rows, cols,
                                       static_cast<uint32_t>(rows * 131 + cols), random_bytes);
          const std::string what = Shape(kt, rows, cols) + (random_bytes ? " (random bytes)" : "");
          const int64_t row_bytes = m.view.row_bytes;
          std::vector<uint8_t> row(row_bytes);
          for (int64_t r = 0; r < rows; ++r) {
            ExtractInterleaved8Row(kt.type, m.interleaved.data(), cols, r, row.data());
            ASSERT_EQ(std::memcmp(row.data(), m.rows.data() + r * row_bytes, row_bytes), 0)
                << what << " row " << r;
          }
          // The padding rows of the last group are zero (d = 0: they contribute nothing).
          const int64_t padded = Q4_Kx8Groups(rows) * kInterleaved8Rows;
          for (int64_t r = rows; r < padded; ++r) {
            ExtractInterleaved8Row(kt.type, m.interleaved.data(), cols, r, row.data());
            for (uint8_t b : row) ASSERT_EQ(b, 0) << what << " padding row " << r;
          }
          EXPECT_EQ(static_cast<int64_t>(m.interleaved.size()),
                    padded / kInterleaved8Rows * Interleaved8GroupBytes(kt.type, cols));
        }
      }
    }
    EXPECT_EQ(Interleaved8GroupBytes(kt.type, 256), kInterleaved8Rows * kt.row_block_bytes)
        << kt.name;
  }
}

class KQuantX8KernelTest : public testing::KernelFamilyTest {};

TEST_P(KQuantX8KernelTest, MatchesDoubleReferenceAndRowLayout) {
  for (const KType& kt : kTypes) {
    for (int64_t rows : kRows) {
      for (int64_t cols : kCols) {
        const KMatrix m = MakeMatrix(kt.type, rows, cols, static_cast<uint32_t>(rows * 7 + cols));
        // 35 tokens: two 16-token AMX tiles (q4_kx8_amx.cc, where the CPU has AMX) and a tail.
        for (const int64_t n_tokens : {3, 35}) {
          const std::vector<float> x = Activations(n_tokens * cols, static_cast<uint32_t>(cols));
          const std::vector<float> y = testing::MultiplyOnPool(m.packed, x, n_tokens, 2);
          const std::vector<float> y_rows = testing::MultiplyOnPool(m.view, x, n_tokens, 2);
          const double knb = static_cast<double>(kt.terms * (cols / kQK_K));
          std::vector<uint8_t> q8k(cols / kQK_K * kQ8KBlockBytes);
          for (int64_t t = 0; t < n_tokens; ++t) {
            QuantizeRowQ8_K(x.data() + t * cols, q8k.data(), cols);
            for (int64_t r = 0; r < rows; ++r) {
              double ref, p;
              kt.reference(m.rows.data() + r * m.view.row_bytes, q8k.data(), cols, &ref, &p);
              const float got = y[t * rows + r];
              EXPECT_LE(std::fabs(got - ref), (knb / 2 + 2) * FLT_EPSILON * p + 1e-30)
                  << Shape(kt, rows, cols) << " row " << r << " token " << t;
              EXPECT_LE(std::fabs(static_cast<double>(got) - y_rows[t * rows + r]),
                        (knb + 4) * FLT_EPSILON * p + 1e-30)
                  << Shape(kt, rows, cols) << " row " << r << " token " << t << " vs row layout";
            }
          }
        }
      }
    }
  }
}

TEST_P(KQuantX8KernelTest, ThreadsBatchesAndRangesAreBitIdentical) {
  for (const KType& kt : kTypes) {
    for (int64_t rows : kRows) {
      for (int64_t cols : kCols) {
        const KMatrix m = MakeMatrix(kt.type, rows, cols, static_cast<uint32_t>(rows + cols));
        const std::string what = Shape(kt, rows, cols);
        const int64_t n_tokens = 6;  // a full 4-token tile and a partial one
        const std::vector<float> x = Activations(n_tokens * cols, 5);
        const std::vector<float> base = testing::MultiplyOnPool(m.packed, x, n_tokens, 1);
        for (int threads : {2, 3}) {
          EXPECT_TRUE(
              testing::SameBits(testing::MultiplyOnPool(m.packed, x, n_tokens, threads), base))
              << what << " threads " << threads;
        }
        for (int64_t t = 0; t < n_tokens; ++t) {
          const std::vector<float> one(x.begin() + t * cols, x.begin() + (t + 1) * cols);
          const std::vector<float> y1 = testing::MultiplyOnPool(m.packed, one, 1, 1);
          EXPECT_EQ(std::memcmp(y1.data(), base.data() + t * rows, rows * sizeof(float)), 0)
              << what << " token " << t << " alone";
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
                    << what << " [" << r0 << ", " << r1 << ") row " << r;
              }
            }
          }
        }
      }
    }
  }
}

// The sparse products never see the interleaved copy: they equal the row layout's exactly.
TEST_P(KQuantX8KernelTest, GatherAndAxpyKeepTheRowLayout) {
  for (const KType& kt : kTypes) {
    const KMatrix m = MakeMatrix(kt.type, 33, 512, 9);
    const std::vector<float> x = Activations(512, 10);
    ThreadPool pool(2);
    const std::vector<int32_t> ids = {32, 0, 7, 8, 9, 31, 16};
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<float> a(ids.size()), b(ids.size());
    GatherMatMul(m.packed, ids.data(), n, x.data(), a.data(), pool);
    GatherMatMul(m.view, ids.data(), n, x.data(), b.data(), pool);
    EXPECT_TRUE(testing::SameBits(a, b)) << kt.name;
    const std::vector<float> rows_y = testing::MultiplyOnPool(m.view, x, 1, 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(std::memcmp(&a[i], &rows_y[ids[i]], sizeof(float)), 0)
          << kt.name << " id " << ids[i];
    }
    std::vector<float> ya(512, 0.25f), yb(512, 0.25f);
    AxpyRows(m.packed, ids.data(), x.data(), n, ya.data(), pool);
    AxpyRows(m.view, ids.data(), x.data(), n, yb.data(), pool);
    EXPECT_TRUE(testing::SameBits(ya, yb)) << kt.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, KQuantX8KernelTest,
                         ::testing::ValuesIn(testing::kKernelFamilies), testing::KernelFamilyName);

// Same operations in the same order (q4_kx8.cc / q4_kx8_avx2.cc / q4_kx8_avx512.cc, q6_kx8.cc /
// q6_kx8_avx2.cc / q6_kx8_avx512.cc): the same bits, GEMV and GEMM.
TEST(KQuantX8FamiliesTest, PortableAvx2AndAvx512AgreeBitForBit) {
  if (!matmul_internal::CpuHasAvx2()) GTEST_SKIP() << "no AVX2";
  const SimdLevel saved = ActiveKernelSimdLevel();
  const bool saved_vnni = ActiveKernelUsesVnni();
  for (const KType& kt : kTypes) {
    for (int64_t rows : kRows) {
      for (int64_t cols : kCols) {
        const KMatrix m = MakeMatrix(kt.type, rows, cols, static_cast<uint32_t>(3 * rows + cols));
        for (int64_t n_tokens : {1, 5, 11, 35}) {
          const std::vector<float> x = Activations(n_tokens * cols, 11);
          ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kPortable));
          const std::vector<float> portable = testing::MultiplyOnPool(m.packed, x, n_tokens, 2);
          ASSERT_TRUE(SetSimdLevelForTesting(SimdLevel::kAvx2));
          const std::vector<float> avx2 = testing::MultiplyOnPool(m.packed, x, n_tokens, 2);
          EXPECT_TRUE(testing::SameBits(portable, avx2))
              << Shape(kt, rows, cols) << " tokens " << n_tokens;
          if (SetSimdLevelForTesting(SimdLevel::kAvx512)) {
            const std::vector<float> avx512 = testing::MultiplyOnPool(m.packed, x, n_tokens, 2);
            EXPECT_TRUE(testing::SameBits(avx2, avx512))
                << Shape(kt, rows, cols) << " tokens " << n_tokens << " avx512";
          }
        }
      }
    }
  }
  SetSimdLevelForTesting(saved, saved_vnni);
}

}  // namespace
}  // namespace thermocline
