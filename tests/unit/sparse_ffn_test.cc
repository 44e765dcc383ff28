// The neuron-level sparse FFN core (NeuronFfn, DownRows) against its dense counterparts: every
// sparse path must equal the dense computation restricted to the same rows, for every weight type,
// on random inputs and random active sets (empty, one row, all rows, unaligned sizes), at several
// pool sizes.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/quant.h"
#include "shared/runtime/ops.h"
#include "shared/sparsity/neuron_ffn.h"

namespace thermocline {
namespace {

constexpr GgmlType kAllTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                                  GgmlType::kQ4_0};

bool IsQuant(GgmlType t) { return t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0; }
std::string TypeName(GgmlType t) { return std::string(TypeTraits(t).name); }

struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // rows x cols, what the kernels multiply
  MatrixView view;
};

TestMatrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, float scale, std::mt19937& rng) {
  TestMatrix m;
  const int64_t rb = RowBytes(type, cols);
  m.bytes.assign(rows * rb, 0);
  m.deq.resize(rows * cols);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> src(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : src) v = normal(rng);
    QuantizeRow(type, src.data(), m.bytes.data() + r * rb, cols);
    DequantizeRow(type, m.bytes.data() + r * rb, m.deq.data() + r * cols, cols);
  }
  m.view = MatrixView{type, rows, cols, m.bytes.data(), rb};
  return m;
}

std::vector<float> RandomVector(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

// The classic bound for n f32 terms summed in any order (see matmul_test.cc), doubled.
double Tolerance(int64_t n, double sum_abs) {
  return (static_cast<double>(n) + 4.0) * FLT_EPSILON * sum_abs + 1e-30;
}

// A layer's FFN built in memory: gate/up/down_t of one type, [ffn][dim].
struct TestLayer {
  TestMatrix gate, up, down_t;
  NeuronWeights weights;
};

TestLayer MakeLayer(GgmlType type, FfnActivation act, int64_t ffn, int64_t dim, std::mt19937& rng) {
  TestLayer l;
  l.gate = MakeMatrix(type, ffn, dim, 1.0f / std::sqrt(static_cast<float>(dim)), rng);
  l.up = MakeMatrix(type, ffn, dim, 1.0f / std::sqrt(static_cast<float>(dim)), rng);
  l.down_t = MakeMatrix(type, ffn, dim, 1.0f / std::sqrt(static_cast<float>(ffn)), rng);
  l.weights = NeuronWeights{l.gate.view, l.up.view, l.down_t.view, act};
  return l;
}

// Candidate lists of every shape the issue names: empty, one row, all rows, and random subsets
// of unaligned sizes, ascending and shuffled.
std::vector<std::vector<int32_t>> CandidateSets(int64_t ffn, std::mt19937& rng) {
  std::vector<int32_t> all(ffn);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int32_t>> sets = {{}, {static_cast<int32_t>(ffn / 3)}, all};
  for (int64_t n : {int64_t{7}, int64_t{37}, ffn - 5}) {
    std::vector<int32_t> s = all;
    std::shuffle(s.begin(), s.end(), rng);
    s.resize(n);
    std::vector<int32_t> sorted = s;
    std::sort(sorted.begin(), sorted.end());
    sets.push_back(sorted);
    sets.push_back(s);
  }
  return sets;
}

struct FilterCase {
  const char* name;
  NeuronFilter filter;
};

// The dense counterpart: gate and up over all rows by MatMul, the activation and product with
// the same float operations as DenseFfn (ops.h), the filter applied to the same activation.
struct DenseRef {
  std::vector<float> act, coeff;  // per neuron: act(gate), act(gate) * up
};

DenseRef DenseReference(const TestLayer& l, const float* h, ThreadPool& pool) {
  const int64_t ffn = l.weights.ffn_dim(), dim = l.weights.dim();
  DenseRef r;
  std::vector<float> gate(ffn), up(ffn);
  MatMul(l.gate.view, h, 1, dim, gate.data(), ffn, pool);
  MatMul(l.up.view, h, 1, dim, up.data(), ffn, pool);
  r.act.resize(ffn);
  std::vector<float> ones(ffn, 1.0f);
  r.act = gate;
  // act(g) * 1 is act(g) exactly; then act(g) * up as DenseFfn computes it.
  if (l.weights.activation == FfnActivation::kSilu) {
    SwiGlu(r.act.data(), ones.data(), ffn);
  } else {
    ReluGlu(r.act.data(), ones.data(), ffn);
  }
  r.coeff = gate;
  if (l.weights.activation == FfnActivation::kSilu) {
    SwiGlu(r.coeff.data(), up.data(), ffn);
  } else {
    ReluGlu(r.coeff.data(), up.data(), ffn);
  }
  return r;
}

bool Passes(const NeuronFilter& f, float a) {
  switch (f.kind) {
    case NeuronFilter::Kind::kNone:
      return true;
    case NeuronFilter::Kind::kPositive:
      return a > 0.0f;
    case NeuronFilter::Kind::kMagnitude:
      return std::fabs(a) >= f.cut;
  }
  return false;
}

class NeuronFfnTest : public ::testing::TestWithParam<FfnActivation> {};

TEST_P(NeuronFfnTest, EqualsDenseRestrictedToTheSameRows) {
  const FfnActivation act = GetParam();
  std::mt19937 rng(act == FfnActivation::kRelu ? 11 : 12);
  for (GgmlType type : kAllTypes) {
    // Ragged float rows; quantized rows need whole blocks. ffn is not a multiple of any tile.
    const int64_t dim = IsQuant(type) ? 96 : 75, ffn = 203;
    TestLayer l = MakeLayer(type, act, ffn, dim, rng);
    ASSERT_TRUE(ValidateNeuronWeights(l.weights).ok());
    const std::vector<float> h = RandomVector(dim, rng);
    ThreadPool pool1(1);
    const DenseRef ref = DenseReference(l, h.data(), pool1);
    std::vector<float> mags(ffn);
    for (int64_t i = 0; i < ffn; ++i) mags[i] = std::fabs(ref.act[i]);
    std::nth_element(mags.begin(), mags.begin() + ffn / 2, mags.end());
    const FilterCase filters[] = {{"none", NeuronFilter::None()},
                                  {"positive", NeuronFilter::Positive()},
                                  {"magnitude", NeuronFilter::Magnitude(mags[ffn / 2])}};
    const std::vector<float> out0 = RandomVector(dim, rng);
    for (const std::vector<int32_t>& cand : CandidateSets(ffn, rng)) {
      for (const FilterCase& fc : filters) {
        std::vector<int32_t> expect_ids;
        std::vector<double> expect(out0.begin(), out0.end()), sum_abs(dim);
        for (int64_t c = 0; c < dim; ++c) sum_abs[c] = std::fabs(out0[c]);
        for (int32_t i : cand) {
          if (!Passes(fc.filter, ref.act[i])) continue;
          expect_ids.push_back(i);
          for (int64_t c = 0; c < dim; ++c) {
            const double p = static_cast<double>(ref.coeff[i]) * l.down_t.deq[i * dim + c];
            expect[c] += p;
            sum_abs[c] += std::fabs(p);
          }
        }
        for (int threads : {1, 2, 3}) {
          SCOPED_TRACE(TypeName(type) + " filter=" + fc.name + " n=" + std::to_string(cand.size()) +
                       " threads=" + std::to_string(threads));
          ThreadPool pool(threads);
          NeuronFfn core;
          std::vector<float> out = out0;
          out.push_back(-7.0f);  // guard
          const int64_t ran = core.Compute(l.weights, h.data(), cand, fc.filter, out.data(), pool);
          // The gate values are the dense MatMul's bits, so the filter picks the same rows.
          ASSERT_EQ(ran, static_cast<int64_t>(expect_ids.size()));
          ASSERT_EQ(std::vector<int32_t>(core.survivors().begin(), core.survivors().end()),
                    expect_ids);
          for (int64_t c = 0; c < dim; ++c) {
            ASSERT_NEAR(out[c], expect[c], Tolerance(ran + 1, sum_abs[c])) << "c=" << c;
          }
          EXPECT_EQ(out[dim], -7.0f);
        }
      }
    }
  }
}

// One neuron from zero: out = coeff * down_t row in one rounding, so equal bits prove that the
// per-neuron product act(gate . h) * (up . h) is the dense pass's, bit for bit.
TEST_P(NeuronFfnTest, OneNeuronIsTheDenseProductBitForBit) {
  const FfnActivation act = GetParam();
  std::mt19937 rng(21);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    const int64_t dim = 64, ffn = 40;
    TestLayer l = MakeLayer(type, act, ffn, dim, rng);
    const std::vector<float> h = RandomVector(dim, rng);
    ThreadPool pool(2);
    const DenseRef ref = DenseReference(l, h.data(), pool);
    NeuronFfn core(ffn);
    for (int32_t i = 0; i < ffn; ++i) {
      std::vector<float> out(dim, 0.0f);
      const int32_t id[] = {i};
      core.Compute(l.weights, h.data(), id, NeuronFilter::None(), out.data(), pool);
      for (int64_t c = 0; c < dim; ++c) {
        ASSERT_EQ(out[c], ref.coeff[i] * l.down_t.deq[i * dim + c])
            << TypeName(type) << " neuron " << i << " c=" << c;
      }
    }
  }
}

TEST_P(NeuronFfnTest, GivenGateEqualsComputedGate) {
  std::mt19937 rng(31);
  const int64_t dim = 64, ffn = 77;
  TestLayer l = MakeLayer(GgmlType::kF16, GetParam(), ffn, dim, rng);
  const std::vector<float> h = RandomVector(dim, rng);
  ThreadPool pool(2);
  std::vector<int32_t> all(ffn);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> gate(ffn);
  MatMul(l.gate.view, h.data(), 1, dim, gate.data(), ffn, pool);
  NeuronFfn a, b;
  std::vector<float> out_a(dim, 0.0f), out_b(dim, 0.0f);
  const int64_t na =
      a.Compute(l.weights, h.data(), all, NeuronFilter::Positive(), out_a.data(), pool);
  const int64_t nb = b.ComputeWithGate(l.weights, h.data(), all, gate.data(),
                                       NeuronFilter::Positive(), out_b.data(), pool);
  EXPECT_EQ(na, nb);
  EXPECT_EQ(out_a, out_b);
}

INSTANTIATE_TEST_SUITE_P(Activations, NeuronFfnTest,
                         ::testing::Values(FfnActivation::kRelu, FfnActivation::kSilu),
                         [](const ::testing::TestParamInfo<FfnActivation>& info) {
                           return std::string(info.param == FfnActivation::kRelu ? "relu" : "silu");
                         });

TEST(NeuronFfnValidationTest, ShapesAndIds) {
  std::mt19937 rng(1);
  TestLayer l = MakeLayer(GgmlType::kF32, FfnActivation::kRelu, 10, 8, rng);
  EXPECT_TRUE(ValidateNeuronWeights(l.weights).ok());
  NeuronWeights bad = l.weights;
  bad.down_t.cols = 9;
  EXPECT_FALSE(ValidateNeuronWeights(bad).ok());
  bad = l.weights;
  bad.up.data = nullptr;
  EXPECT_FALSE(ValidateNeuronWeights(bad).ok());

  EXPECT_TRUE(ValidateNeuronIds(std::vector<int32_t>{}, 10).ok());
  EXPECT_TRUE(ValidateNeuronIds(std::vector<int32_t>{0, 3, 9}, 10).ok());
  EXPECT_EQ(ValidateNeuronIds(std::vector<int32_t>{0, 10}, 10).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ValidateNeuronIds(std::vector<int32_t>{-1}, 10).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ValidateNeuronIds(std::vector<int32_t>{2, 2}, 10).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateNeuronIds(std::vector<int32_t>{3, 1}, 10).code(),
            absl::StatusCode::kInvalidArgument);
}

// down_t[i][c] == down[c][i]: the same bits for float types; for Q8_0/Q4_0 re-stored along the
// other axis, within one requantization step of the new block (or exactly when kept as F16
// or F32, up to the F16 rounding of the dequantized value).
TEST(DownRowsTest, TransposeIsExactForFloatsAndBoundedForQuantized) {
  std::mt19937 rng(41);
  for (GgmlType src : kAllTypes) {
    const int64_t dim = IsQuant(src) ? 64 : 70, ffn = IsQuant(src) ? 96 : 83;
    TestMatrix down = MakeMatrix(src, dim, ffn, 1.0f, rng);
    std::vector<GgmlType> targets = {src};
    if (IsQuant(src)) targets = {src, GgmlType::kF16, GgmlType::kF32};
    for (GgmlType dst : targets) {
      SCOPED_TRACE(TypeName(src) + " -> " + TypeName(dst));
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        auto rows = DownRows::Transpose(down.view, dst, pool);
        ASSERT_TRUE(rows.ok()) << rows.status();
        const MatrixView& v = rows->view();
        ASSERT_EQ(v.rows, ffn);
        ASSERT_EQ(v.cols, dim);
        ASSERT_EQ(v.type, dst);
        EXPECT_EQ(rows->owned_bytes(), ffn * RowBytes(dst, dim));
        std::vector<float> row(dim);
        for (int64_t i = 0; i < ffn; ++i) {
          DequantizeMatrixRow(v, i, row.data());
          for (int64_t b = 0; b < dim; b += kQK) {
            // The bound of one requantization of this block of the new row.
            double amax = 0;
            for (int64_t c = b; c < std::min(dim, b + kQK); ++c) {
              amax = std::max(amax, std::fabs(static_cast<double>(down.deq[c * ffn + i])));
            }
            double bound = 0;
            if (dst == GgmlType::kQ8_0) bound = 0.6 * amax / 127;
            if (dst == GgmlType::kQ4_0) bound = 1.1 * amax / 8;
            if (dst == GgmlType::kF16 && src != dst) bound = amax * 0x1p-11;
            for (int64_t c = b; c < std::min(dim, b + kQK); ++c) {
              const float want = down.deq[c * ffn + i];
              if (IsQuant(dst) || dst != src) {
                ASSERT_LE(std::fabs(row[c] - want), bound) << "i=" << i << " c=" << c;
              } else {
                ASSERT_EQ(row[c], want) << "i=" << i << " c=" << c;
              }
            }
          }
        }
        // Float types: the very bytes, element by element.
        if (!IsQuant(src)) {
          const int64_t es = TypeTraits(src).block_bytes;
          for (int64_t i = 0; i < ffn; ++i) {
            for (int64_t c = 0; c < dim; ++c) {
              ASSERT_EQ(std::memcmp(v.row(i) + c * es, down.view.row(c) + i * es, es), 0);
            }
          }
        }
      }
    }
  }
  ThreadPool pool(1);
  TestMatrix f16 = MakeMatrix(GgmlType::kF16, 8, 8, 1.0f, rng);
  EXPECT_FALSE(DownRows::Transpose(f16.view, GgmlType::kF32, pool).ok());
}

}  // namespace
}  // namespace thermocline
