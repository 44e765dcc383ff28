// The neuron-level sparse FFN core (NeuronFfn, DownRows) and the SparseFfn executor against
// their dense counterparts: every sparse path must equal the dense computation restricted to
// the same rows, for every weight type, on random inputs and random active sets (empty, one
// row, all rows, unaligned sizes), at several pool sizes.
#include "shared/sparsity/sparse_ffn.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/quant.h"
#include "shared/model/synth.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/ops.h"
#include "shared/sparsity/neuron_bundle.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/predictor.h"
#include "shared/sparsity/sparsity_mode.h"
#include "tests/test_support.h"

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
  struct Shape {
    int64_t dim, ffn;
  };
  // Small: ragged float rows (quantized rows need whole blocks), ffn not a multiple of any tile,
  // every share below the size worth splitting. Large: candidates and survivors split over the
  // pool's threads.
  for (const Shape shape : {Shape{75, 203}, Shape{1024, 333}})
    for (GgmlType type : kAllTypes) {
      const int64_t dim = IsQuant(type) ? (shape.dim + kQK - 1) / kQK * kQK : shape.dim;
      const int64_t ffn = shape.ffn;
      TestLayer l = MakeLayer(type, act, ffn, dim, rng);
      ASSERT_TRUE(ValidateNeuronWeights(l.weights).ok());
      const std::vector<float> h = RandomVector(dim, rng);
      ThreadPool pool1(1);
      const DenseRef ref = DenseReference(l, h.data(), pool1);
      std::vector<float> mags(ffn);
      for (int64_t i = 0; i < ffn; ++i) mags[i] = std::fabs(ref.act[i]);
      std::nth_element(mags.begin(), mags.begin() + ffn / 2, mags.end());
      const float median_act = mags[ffn / 2];
      std::nth_element(mags.begin(), mags.begin() + ffn / 4, mags.end());
      std::vector<float> coeffs(ffn);
      for (int64_t i = 0; i < ffn; ++i) coeffs[i] = std::fabs(ref.coeff[i]);
      std::nth_element(coeffs.begin(), coeffs.begin() + ffn / 2, coeffs.end());
      const FilterCase filters[] = {
          {"none", NeuronFilter::None()},
          {"positive", NeuronFilter::Positive()},
          {"magnitude", NeuronFilter::Magnitude(median_act)},
          {"two-stage", NeuronFilter::Magnitude(mags[ffn / 4], coeffs[ffn / 2])}};
      const std::vector<float> out0 = RandomVector(dim, rng);
      for (const std::vector<int32_t>& cand : CandidateSets(ffn, rng)) {
        for (const FilterCase& fc : filters) {
          std::vector<int32_t> expect_ids;
          int64_t expect_down = 0;
          std::vector<double> expect(out0.begin(), out0.end()), sum_abs(dim);
          for (int64_t c = 0; c < dim; ++c) sum_abs[c] = std::fabs(out0[c]);
          for (int32_t i : cand) {
            if (!Passes(fc.filter, ref.act[i])) continue;
            expect_ids.push_back(i);
            // The coefficient is the dense product's bits too, so the second stage also picks
            // the same rows.
            if (std::fabs(ref.coeff[i]) < fc.filter.coeff_cut) continue;
            ++expect_down;
            for (int64_t c = 0; c < dim; ++c) {
              const double p = static_cast<double>(ref.coeff[i]) * l.down_t.deq[i * dim + c];
              expect[c] += p;
              sum_abs[c] += std::fabs(p);
            }
          }
          for (int threads : {1, 2, 3}) {
            SCOPED_TRACE(TypeName(type) + " filter=" + fc.name + " n=" +
                         std::to_string(cand.size()) + " threads=" + std::to_string(threads));
            ThreadPool pool(threads);
            NeuronFfn core;
            std::vector<float> out = out0;
            out.push_back(-7.0f);  // guard
            const int64_t ran =
                core.Compute(l.weights, h.data(), cand, fc.filter, out.data(), pool);
            // The gate values are the dense MatMul's bits, so the filter picks the same rows.
            ASSERT_EQ(ran, static_cast<int64_t>(expect_ids.size()));
            ASSERT_EQ(std::vector<int32_t>(core.survivors().begin(), core.survivors().end()),
                      expect_ids);
            ASSERT_EQ(core.down_rows(), expect_down);
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
// A bundle holds every neuron's rows byte for byte at one stride, the gate only when asked
// (and when there is one), and NeuronFfn over it gives the separate rows' bits for every
// candidate set, filter and pool size.
TEST(NeuronBundleTest, HoldsEachNeuronsRowsSideBySideWithTheSameBits) {
  std::mt19937 rng(41);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K}) {
    const int64_t ffn = 150, dim = 256;
    TestLayer layer = MakeLayer(type, FfnActivation::kRelu, ffn, dim, rng);
    for (bool gated : {true, false}) {
      NeuronWeights w = layer.weights;
      if (!gated) w.gate = MatrixView{};
      for (bool with_gate : {true, false}) {
        ThreadPool build_pool(2);
        auto bundle = NeuronBundle::Build(w, with_gate, build_pool);
        ASSERT_TRUE(bundle.ok()) << bundle.status();
        const NeuronWeights& b = bundle->weights();
        const std::string what = std::string(TypeTraits(type).name) + (gated ? " gated" : " plain") +
                                 (with_gate ? " with gate" : " without gate");
        EXPECT_EQ(bundle->has_gate(), gated && with_gate) << what;
        const int64_t rb = RowBytes(type, dim);
        // Each part padded to whole cache lines (q8_0's 272-byte rows to 320).
        EXPECT_EQ(b.up.row_bytes, (bundle->has_gate() ? 3 : 2) * ((rb + 63) / 64 * 64)) << what;
        EXPECT_EQ(bundle->bytes(), ffn * b.up.row_bytes) << what;
        if (gated && !with_gate) {
          EXPECT_EQ(b.gate.data, w.gate.data) << what;
        }
        if (!gated) {
          EXPECT_TRUE(b.gate.empty()) << what;
        }
        for (int64_t i = 0; i < ffn; ++i) {
          ASSERT_EQ(std::memcmp(b.up.row(i), w.up.row(i), rb), 0) << what << " up " << i;
          ASSERT_EQ(std::memcmp(b.down_t.row(i), w.down_t.row(i), rb), 0) << what << " down " << i;
          if (gated) {
            ASSERT_EQ(std::memcmp(b.gate.row(i), w.gate.row(i), rb), 0) << what << " gate " << i;
          }
        }
        const std::vector<float> h = RandomVector(dim, rng);
        for (const std::vector<int32_t>& cand : CandidateSets(ffn, rng)) {
          for (const NeuronFilter& f : {NeuronFilter::None(), NeuronFilter::Positive(),
                                        NeuronFilter::Magnitude(0.05f, 0.01f)}) {
            for (int threads : {1, 2, 3}) {
              ThreadPool pool(threads);
              NeuronFfn separate(ffn), bundled(ffn);
              std::vector<float> want(dim, 0.0f), got(dim, 0.0f);
              const int64_t n_want = separate.Compute(w, h.data(), cand, f, want.data(), pool);
              const int64_t n_got = bundled.Compute(b, h.data(), cand, f, got.data(), pool);
              ASSERT_EQ(n_got, n_want) << what;
              ASSERT_EQ(std::memcmp(got.data(), want.data(), dim * sizeof(float)), 0)
                  << what << ", " << cand.size() << " candidates, " << threads << " threads";
            }
          }
        }
      }
    }
  }
}

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

// Matrices of one input side by side (TEAL's q, k, v): row c of the copy is row c of each
// part's own Transpose in turn, byte for byte; parts that disagree in width, or whose outputs
// are not whole blocks of the copy's type, are refused.
TEST(DownRowsTest, SideBySideIsEachPartsTransposeInTurn) {
  std::mt19937 rng(43);
  for (GgmlType src : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    const int64_t cols = 96;
    const int64_t outs[] = {64, 32, 96};
    std::vector<TestMatrix> parts;
    std::vector<MatrixView> views;
    for (int64_t o : outs) parts.push_back(MakeMatrix(src, o, cols, 1.0f, rng));
    for (const TestMatrix& m : parts) views.push_back(m.view);
    const GgmlType dst = DownRows::TransposedType(src, std::nullopt);
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      auto joint = DownRows::TransposeSideBySide(views, dst, pool);
      ASSERT_TRUE(joint.ok()) << joint.status();
      const MatrixView& v = joint->view();
      ASSERT_EQ(v.rows, cols);
      ASSERT_EQ(v.cols, 64 + 32 + 96);
      EXPECT_EQ(joint->owned_bytes(), cols * RowBytes(dst, v.cols));
      int64_t at = 0;
      for (const MatrixView& part : views) {
        auto alone = DownRows::Transpose(part, dst, pool);
        ASSERT_TRUE(alone.ok());
        const int64_t bytes = RowBytes(dst, part.rows);
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(std::memcmp(v.row(c) + RowBytes(dst, at), alone->view().row(c), bytes), 0)
              << TypeName(src) << " part at " << at << " row " << c;
        }
        at += part.rows;
      }
    }
  }
  ThreadPool pool(1);
  TestMatrix a = MakeMatrix(GgmlType::kQ4_0, 32, 64, 1.0f, rng);
  TestMatrix b = MakeMatrix(GgmlType::kQ4_0, 32, 96, 1.0f, rng);
  TestMatrix odd = MakeMatrix(GgmlType::kQ4_0, 40, 64, 1.0f, rng);
  const MatrixView widths[] = {a.view, b.view};
  EXPECT_FALSE(DownRows::TransposeSideBySide(widths, GgmlType::kQ4_0, pool).ok());
  const MatrixView blocks[] = {a.view, odd.view};
  EXPECT_FALSE(DownRows::TransposeSideBySide(blocks, GgmlType::kQ4_0, pool).ok());
  EXPECT_FALSE(DownRows::TransposeSideBySide({}, GgmlType::kQ4_0, pool).ok());
}

// Types without a quantizer: a real llama.cpp ffn_down (../shared/models/quants/dequant/: [256
// down rows][768 neurons], 3 super-blocks per row) transposed via f32, stored as Q8_0 by
// default (ForLayer) or as f32 / f16 on request; a bf16 target, or one without a quantizer, is
// refused.
TEST(DownRowsTest, TransposeOfTypesWithoutQuantizer) {
  const std::string dir = testing::ModelPath("quants/dequant");
  for (const char* name : {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}) {
    const std::string base = dir + "/" + name + ".blk.0.ffn_down.weight";
    const std::string raw = testing::ReadFileOrDie(base + ".raw");
    const std::vector<float> deq = testing::ReadF32File(base + ".f32");
    std::string lower = name;
    for (char& ch : lower) ch = static_cast<char>(ch == 'K' ? 'K' : std::tolower(ch));
    const GgmlType src = *TypeFromName(lower);
    const int64_t dim = 256, ffn = 768;
    ASSERT_EQ(static_cast<int64_t>(raw.size()), dim * RowBytes(src, ffn)) << name;
    const MatrixView down{src, dim, ffn, reinterpret_cast<const uint8_t*>(raw.data()),
                          RowBytes(src, ffn)};
    for (GgmlType dst : {GgmlType::kQ8_0, GgmlType::kF32, GgmlType::kF16}) {
      SCOPED_TRACE(std::string(name) + " -> " + TypeName(dst));
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        auto rows = DownRows::Transpose(down, dst, pool);
        ASSERT_TRUE(rows.ok()) << rows.status();
        ASSERT_EQ(rows->view().rows, ffn);
        ASSERT_EQ(rows->view().cols, dim);
        std::vector<float> row(dim);
        for (int64_t i = 0; i < ffn; ++i) {
          DequantizeMatrixRow(rows->view(), i, row.data());
          for (int64_t b = 0; b < dim; b += kQK) {
            double amax = 0;
            for (int64_t c = b; c < b + kQK; ++c) {
              amax = std::max(amax, std::fabs(static_cast<double>(deq[c * ffn + i])));
            }
            const double bound = dst == GgmlType::kQ8_0   ? 0.6 * amax / 127
                                 : dst == GgmlType::kF16 ? amax * 0x1p-11
                                                         : 0.0;
            for (int64_t c = b; c < b + kQK; ++c) {
              ASSERT_LE(std::fabs(row[c] - deq[c * ffn + i]), bound) << "i=" << i << " c=" << c;
            }
          }
        }
      }
    }
    ThreadPool pool(1);
    EXPECT_FALSE(DownRows::Transpose(down, GgmlType::kBF16, pool).ok());
    EXPECT_EQ(DownRows::Transpose(down, src, pool).ok(), HasQuantizer(src));
  }
}

TEST(SparsityModeTest, NamesRoundTrip) {
  for (SparsityMode m : {SparsityMode::kDense, SparsityMode::kExact, SparsityMode::kThreshold,
                         SparsityMode::kPredicted}) {
    auto parsed = ParseSparsityMode(SparsityModeName(m));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_FALSE(ParseSparsityMode("sparse").has_value());
  auto bad = ParseSparsityModeOrError("Dense");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dense, exact, threshold, predicted"), std::string::npos);
}

std::unique_ptr<Model> SynthModel(GgmlType type, SynthFfnKind kind) {
  return testing::SmallSynthModel(type, kind);
}

TEST(SparsityPlanTest, ValidationNamesWhatIsWrong) {
  auto relu = SynthModel(GgmlType::kF32, SynthFfnKind::kReluGated);
  auto silu = SynthModel(GgmlType::kF32, SynthFfnKind::kSwiGlu);
  ASSERT_TRUE(relu && silu);
  EXPECT_TRUE(SparsityPlan::Uniform(SparsityMode::kExact, 2).Validate(relu->config()).ok());
  absl::Status s = SparsityPlan::Uniform(SparsityMode::kExact, 2).Validate(silu->config());
  EXPECT_NE(s.message().find("ReLU"), std::string::npos) << s;
  s = SparsityPlan::Uniform(SparsityMode::kDense, 3).Validate(relu->config());
  EXPECT_NE(s.message().find("2 layers"), std::string::npos) << s;
  SparsityPlan p = SparsityPlan::Uniform(SparsityMode::kThreshold, 2);
  p.cuts[1] = -1;
  s = p.Validate(silu->config());
  EXPECT_NE(s.message().find("layer 1"), std::string::npos) << s;
  s = SparsityPlan::Uniform(SparsityMode::kPredicted, 2).Validate(relu->config());
  EXPECT_NE(s.message().find("predictors"), std::string::npos) << s;

  auto t = SparsityPlan::ForModel(silu->config(), SparsityMode::kThreshold, nullptr, 0.5f, nullptr);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("--stats"), std::string::npos) << t.status();
  auto pr = SparsityPlan::ForModel(relu->config(), SparsityMode::kPredicted, nullptr, {}, nullptr);
  ASSERT_FALSE(pr.ok());
  EXPECT_NE(pr.status().message().find("--predictor"), std::string::npos) << pr.status();

  ActivationStats stats;
  stats.criterion = "magnitude";
  stats.targets = {0.3f, 0.5f};
  stats.dim = 64;
  stats.ffn_dim = 160;
  stats.layers.resize(2);
  stats.layers[0].cuts = {0.01f, 0.02f};
  stats.layers[1].cuts = {0.03f, 0.04f};
  // A profile from before coefficient cuts cannot serve threshold mode, and says so.
  auto old = SparsityPlan::ForModel(silu->config(), SparsityMode::kThreshold, &stats, 0.5f, nullptr);
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("profile the model again"), std::string::npos)
      << old.status();
  stats.layers[0].coeff_cuts = {0.1f, 0.2f};
  stats.layers[1].coeff_cuts = {0.3f, 0.4f};
  auto ok = SparsityPlan::ForModel(silu->config(), SparsityMode::kThreshold, &stats, 0.5f, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status();
  // Coefficient cuts of the target; no gate cut unless asked.
  EXPECT_EQ(ok->coeff_cuts, (std::vector<float>{0.2f, 0.4f}));
  EXPECT_EQ(ok->cuts, (std::vector<float>{0.0f, 0.0f}));
  auto two = SparsityPlan::ForModel(silu->config(), SparsityMode::kThreshold, &stats, 0.5f,
                                    nullptr, 0.3f);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->cuts, (std::vector<float>{0.01f, 0.03f}));
  const NeuronFilter f = two->FilterFor(1, FfnActivation::kSilu);
  EXPECT_EQ(f.kind, NeuronFilter::Kind::kMagnitude);
  EXPECT_EQ(f.cut, 0.03f);
  EXPECT_EQ(f.coeff_cut, 0.4f);
  auto missing = SparsityPlan::ForModel(silu->config(), SparsityMode::kThreshold, &stats, 0.5f,
                                        nullptr, 0.2f);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("0.3, 0.5"), std::string::npos) << missing.status();
  EXPECT_NE(missing.status().message().find("--gate-sparsity 0.2"), std::string::npos)
      << missing.status();
  SparsityPlan wrong = SparsityPlan::Uniform(SparsityMode::kDense, 2);
  wrong.coeff_cuts[0] = 0.1f;
  s = wrong.Validate(silu->config());
  EXPECT_NE(s.message().find("threshold"), std::string::npos) << s;
  stats.ffn_dim = 128;
  auto mismatch =
      SparsityPlan::ForModel(silu->config(), SparsityMode::kThreshold, &stats, 0.5f, nullptr);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("ffn_dim 128"), std::string::npos);
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Bytes of the [up | down] bundles of `layers` exact or threshold layers (each part whole
// cache lines).
int64_t UpDownBundleBytes(const ModelConfig& c, GgmlType up, GgmlType down, int64_t layers) {
  auto lines = [](int64_t b) { return (b + 63) / 64 * 64; };
  return layers * c.ffn_dim * (lines(RowBytes(up, c.dim)) + lines(RowBytes(down, c.dim)));
}

// SparseFfn layer by layer against DenseFfn on one token (GatherMatMul gate) and on a batch
// (one MatMul for the gate), with the transposed down copy of a llama.cpp-layout model, and
// with it inside the neuron bundles.
TEST(SparseFfnTest, ExactEqualsDenseAndCountsActiveNeurons) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16}) {
    auto model = SynthModel(type, SynthFfnKind::kReluGated);
    ASSERT_TRUE(model);
    const ModelConfig& c = model->config();
    std::mt19937 rng(5);
    for (int threads : {1, 2}) {
     for (bool bundles : {false, true}) {
      ThreadPool pool(threads);
      DenseFfn dense(*model, pool);
      SparseFfnOptions o;
      o.neuron_bundles = bundles;
      auto sparse =
          SparseFfn::Create(*model, SparsityPlan::Uniform(SparsityMode::kExact, 2), pool, o);
      ASSERT_TRUE(sparse.ok()) << sparse.status();
      EXPECT_EQ((*sparse)->down_t_bytes(), bundles ? 0 : 2 * c.ffn_dim * RowBytes(type, c.dim));
      EXPECT_EQ((*sparse)->bundle_bytes(), bundles ? UpDownBundleBytes(c, type, type, 2) : 0);
      for (int64_t n_tokens : {1, 3}) {
        const std::vector<float> h = RandomVector(n_tokens * c.dim, rng);
        for (int64_t l = 0; l < c.n_layers; ++l) {
          (*sparse)->ResetActivity();
          std::vector<float> want(n_tokens * c.dim), got(n_tokens * c.dim, 123.0f);
          dense.Compute(l, h.data(), n_tokens, want.data());
          (*sparse)->Compute(l, h.data(), n_tokens, got.data());
          // Same per-neuron products, another summation order for down: f32 rounding only.
          EXPECT_LE(MaxAbsDiff(want, got), 1e-5f) << TypeName(type) << " layer " << l;
          std::vector<float> gate(n_tokens * c.ffn_dim);
          MatMul(model->layer(l).gate, h.data(), n_tokens, c.dim, gate.data(), c.ffn_dim, pool);
          const int64_t positive =
              std::count_if(gate.begin(), gate.end(), [](float g) { return g > 0; });
          const LayerActivity& a = (*sparse)->activity()[l];
          EXPECT_EQ(a.tokens, n_tokens);
          EXPECT_EQ(a.candidates, n_tokens * c.ffn_dim);
          EXPECT_EQ(a.active, positive);
          EXPECT_DOUBLE_EQ((*sparse)->ActiveRatio(l),
                           static_cast<double>(positive) / (n_tokens * c.ffn_dim));
        }
      }
     }
    }
  }
}

// Threshold on a SwiGLU model: the output is the dense FFN with the rows under the cut removed.
TEST(SparseFfnTest, ThresholdDropsExactlyTheNeuronsUnderTheCut) {
  auto model = SynthModel(GgmlType::kF32, SynthFfnKind::kSwiGlu);
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  std::mt19937 rng(9);
  ThreadPool pool(2);
  const float cut = 0.05f, coeff_cut = 0.01f;
  SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kThreshold, 2);
  plan.cuts = {cut, cut};
  plan.coeff_cuts = {coeff_cut, 0.0f};
  plan.modes[1] = SparsityMode::kDense;
  auto sparse = SparseFfn::Create(*model, plan, pool);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  // Layer 0's up and down rows sit in its bundle (the gate runs whole: not in it); the dense
  // layer has neither.
  EXPECT_EQ((*sparse)->down_t_bytes(), 0);
  EXPECT_EQ((*sparse)->bundle_bytes(), UpDownBundleBytes(c, GgmlType::kF32, GgmlType::kF32, 1));
  const std::vector<float> h = RandomVector(2 * c.dim, rng);
  std::vector<float> got(2 * c.dim);
  (*sparse)->Compute(0, h.data(), 2, got.data());
  // Reference: dense gate/up, SwiGLU, zero under the cut, down in double.
  const LayerWeights& w = model->layer(0);
  std::vector<float> gate(2 * c.ffn_dim), up(2 * c.ffn_dim), act(2 * c.ffn_dim),
      ones(2 * c.ffn_dim, 1.0f);
  MatMul(w.gate, h.data(), 2, c.dim, gate.data(), c.ffn_dim, pool);
  MatMul(w.up, h.data(), 2, c.dim, up.data(), c.ffn_dim, pool);
  act = gate;
  SwiGlu(act.data(), ones.data(), 2 * c.ffn_dim);
  SwiGlu(gate.data(), up.data(), 2 * c.ffn_dim);
  std::vector<float> down(c.dim * c.ffn_dim);
  for (int64_t r = 0; r < c.dim; ++r) DequantizeMatrixRow(w.down, r, down.data() + r * c.ffn_dim);
  int64_t kept = 0, down_kept = 0;
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t r = 0; r < c.dim; ++r) {
      double ref = 0, sum_abs = 0;
      for (int64_t i = 0; i < c.ffn_dim; ++i) {
        if (std::fabs(act[t * c.ffn_dim + i]) < cut) continue;
        if (std::fabs(gate[t * c.ffn_dim + i]) < coeff_cut) continue;
        const double p = static_cast<double>(gate[t * c.ffn_dim + i]) * down[r * c.ffn_dim + i];
        ref += p;
        sum_abs += std::fabs(p);
      }
      EXPECT_NEAR(got[t * c.dim + r], ref, Tolerance(c.ffn_dim, sum_abs));
    }
    for (int64_t i = 0; i < c.ffn_dim; ++i) {
      const bool up = std::fabs(act[t * c.ffn_dim + i]) >= cut;
      kept += up;
      down_kept += up && std::fabs(gate[t * c.ffn_dim + i]) >= coeff_cut;
    }
  }
  EXPECT_EQ((*sparse)->activity()[0].active, kept);
  EXPECT_EQ((*sparse)->activity()[0].down, down_kept);
  EXPECT_LT(kept, 2 * c.ffn_dim);
  EXPECT_LT(down_kept, kept);
  EXPECT_GT(down_kept, 0);
  // The dense layer delegates to DenseFfn and counts every neuron.
  DenseFfn dense(*model, pool);
  std::vector<float> want(2 * c.dim);
  dense.Compute(1, h.data(), 2, want.data());
  (*sparse)->Compute(1, h.data(), 2, got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ((*sparse)->activity()[1].active, 2 * c.ffn_dim);
}

// Quantized models: the default keeps down_t in the model's type; F16 on request.
TEST(SparseFfnTest, QuantizedDownTypeChoice) {
  auto model = SynthModel(GgmlType::kQ4_0, SynthFfnKind::kReluGated);
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  ThreadPool pool(2);
  SparseFfnOptions unbundled;
  unbundled.neuron_bundles = false;  // the copy's own bytes; bundled below
  auto same =
      SparseFfn::Create(*model, SparsityPlan::Uniform(SparsityMode::kExact, 2), pool, unbundled);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->weights(0).down_t.type, GgmlType::kQ4_0);
  EXPECT_EQ((*same)->down_t_bytes(), 2 * c.ffn_dim * RowBytes(GgmlType::kQ4_0, c.dim));
  SparseFfnOptions o;
  o.quantized_down_t_type = GgmlType::kF16;
  auto f16 = SparseFfn::Create(*model, SparsityPlan::Uniform(SparsityMode::kExact, 2), pool, o);
  ASSERT_TRUE(f16.ok()) << f16.status();
  EXPECT_EQ((*f16)->weights(1).down_t.type, GgmlType::kF16);
  EXPECT_EQ((*f16)->down_t_bytes(), 0);  // bundled: the f16 down rows beside the q4_0 up rows
  EXPECT_EQ((*f16)->bundle_bytes(), UpDownBundleBytes(c, GgmlType::kQ4_0, GgmlType::kF16, 2));
  // Both stay close to dense (which rounds its down input to Q8_0): a smoke check of scale.
  std::mt19937 rng(3);
  const std::vector<float> h = RandomVector(c.dim, rng);
  DenseFfn dense(*model, pool);
  std::vector<float> want(c.dim), a(c.dim), b(c.dim);
  dense.Compute(0, h.data(), 1, want.data());
  (*same)->Compute(0, h.data(), 1, a.data());
  (*f16)->Compute(0, h.data(), 1, b.data());
  float norm = 0;
  for (float v : want) norm = std::max(norm, std::fabs(v));
  EXPECT_LE(MaxAbsDiff(want, a), 0.1f * norm);
  EXPECT_LE(MaxAbsDiff(want, b), 0.05f * norm);
}

// A random low-rank predictor per layer: fires on roughly half the neurons at threshold 0.
std::shared_ptr<const PredictorSet> RandomPredictors(const ModelConfig& c, float threshold,
                                                     std::mt19937& rng) {
  std::vector<PredictorWeights> layers(c.n_layers);
  for (PredictorWeights& p : layers) {
    p.rank = 16;
    p.fc1 = RandomVector(p.rank * c.dim, rng);
    p.fc2 = RandomVector(c.ffn_dim * p.rank, rng);
  }
  auto set = PredictorSet::FromWeights(layers, c, GgmlType::kF32, threshold);
  EXPECT_TRUE(set.ok()) << set.status();
  return set.ok() ? std::make_shared<const PredictorSet>(std::move(*set)) : nullptr;
}

// Predicted: the output is the dense FFN restricted to the predicted neurons whose ReLU fires;
// the counts say how many were predicted and how many ran.
TEST(SparseFfnTest, PredictedRunsThePredictedNeuronsThatFire) {
  auto model = SynthModel(GgmlType::kF16, SynthFfnKind::kReluGated);
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  std::mt19937 rng(17);
  SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kPredicted, c.n_layers);
  plan.predictors = RandomPredictors(c, 0.0f, rng);
  ASSERT_TRUE(plan.predictors);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    auto sparse = SparseFfn::Create(*model, plan, pool);
    ASSERT_TRUE(sparse.ok()) << sparse.status();
    const int64_t n_tokens = 3;
    const std::vector<float> h = RandomVector(n_tokens * c.dim, rng);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      std::vector<float> got(n_tokens * c.dim, 5.0f);
      (*sparse)->Compute(l, h.data(), n_tokens, got.data());
      const LayerWeights& w = model->layer(l);
      std::vector<float> gate(c.ffn_dim), up(c.ffn_dim), down(c.dim * c.ffn_dim);
      for (int64_t r = 0; r < c.dim; ++r)
        DequantizeMatrixRow(w.down, r, down.data() + r * c.ffn_dim);
      int64_t predicted = 0, fired = 0;
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* ht = h.data() + t * c.dim;
        std::vector<int32_t> ids;
        plan.predictors->Predict(l, ht, &ids, pool);
        predicted += static_cast<int64_t>(ids.size());
        MatMul(w.gate, ht, 1, c.dim, gate.data(), c.ffn_dim, pool);
        MatMul(w.up, ht, 1, c.dim, up.data(), c.ffn_dim, pool);
        ReluGlu(gate.data(), up.data(), c.ffn_dim);
        for (int64_t r = 0; r < c.dim; ++r) {
          double ref = 0, sum_abs = 0;
          for (int32_t i : ids) {
            const double p = static_cast<double>(gate[i]) * down[r * c.ffn_dim + i];
            ref += p;
            sum_abs += std::fabs(p);
          }
          EXPECT_NEAR(got[t * c.dim + r], ref, Tolerance(c.ffn_dim, sum_abs));
        }
        // ReluGlu left act * up, which is 0 exactly where the ReLU did not fire (up != 0).
        for (int32_t i : ids) fired += gate[i] != 0.0f;
      }
      const LayerActivity& a = (*sparse)->activity()[l];
      EXPECT_EQ(a.candidates, predicted);
      EXPECT_EQ(a.active, fired);
      EXPECT_GT(predicted, n_tokens * c.ffn_dim / 4);
      EXPECT_LT(predicted, n_tokens * c.ffn_dim * 3 / 4);
    }
    EXPECT_GT((*sparse)->FfnBytesPerToken(), 0.0);
  }
  // A predictor that predicts every neuron makes predicted mode exact mode, bit for bit.
  plan.predictors = RandomPredictors(c, -1e30f, rng);
  ThreadPool pool(2);
  auto all = SparseFfn::Create(*model, plan, pool);
  auto exact = SparseFfn::Create(*model, SparsityPlan::Uniform(SparsityMode::kExact, 2), pool);
  ASSERT_TRUE(all.ok() && exact.ok());
  const std::vector<float> h = RandomVector(2 * c.dim, rng);
  std::vector<float> a(2 * c.dim), b(2 * c.dim);
  (*all)->Compute(1, h.data(), 2, a.data());
  (*exact)->Compute(1, h.data(), 2, b.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ((*all)->activity()[1].active, (*exact)->activity()[1].active);
}

// Bundled and separate rows through the whole SparseFfn, exact and predicted, one token and a
// batch, one to three threads: the same bits and the same counts.
TEST(SparseFfnTest, NeuronBundlesGiveTheSeparateRowsBits) {
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    auto model = SynthModel(type, SynthFfnKind::kReluGated);
    ASSERT_TRUE(model);
    const ModelConfig& c = model->config();
    std::mt19937 rng(23);
    SparsityPlan predicted = SparsityPlan::Uniform(SparsityMode::kPredicted, c.n_layers);
    predicted.predictors = RandomPredictors(c, 0.0f, rng);
    for (const SparsityPlan& plan :
         {SparsityPlan::Uniform(SparsityMode::kExact, c.n_layers), predicted}) {
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        SparseFfnOptions off, on;
        off.neuron_bundles = false;
        on.neuron_bundles = true;
        auto separate = SparseFfn::Create(*model, plan, pool, off);
        auto bundled = SparseFfn::Create(*model, plan, pool, on);
        ASSERT_TRUE(separate.ok() && bundled.ok());
        EXPECT_GT((*bundled)->bundle_bytes(), 0);
        for (int64_t n_tokens : {1, 3}) {
          const std::vector<float> h = RandomVector(n_tokens * c.dim, rng);
          for (int64_t l = 0; l < c.n_layers; ++l) {
            std::vector<float> want(n_tokens * c.dim), got(n_tokens * c.dim);
            (*separate)->Compute(l, h.data(), n_tokens, want.data());
            (*bundled)->Compute(l, h.data(), n_tokens, got.data());
            EXPECT_EQ(got, want) << TypeTraits(type).name << " " << SparsityModeName(plan.mode(0))
                                 << " layer " << l << " threads " << threads;
            EXPECT_EQ((*bundled)->activity()[l].active, (*separate)->activity()[l].active);
          }
        }
        EXPECT_DOUBLE_EQ((*bundled)->FfnBytesPerToken(), (*separate)->FfnBytesPerToken());
      }
    }
  }
}

// A plan whose predictors do not fit the model is refused with the layer and shapes.
TEST(SparsityPlanTest, PredictorShapesMustMatch) {
  auto big = SynthModel(GgmlType::kF32, SynthFfnKind::kReluGated);
  ASSERT_TRUE(big);
  ModelConfig other = big->config();
  other.ffn_dim = 96;
  std::mt19937 rng(2);
  SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kPredicted, 2);
  plan.predictors = RandomPredictors(other, 0.0f, rng);
  absl::Status s = plan.Validate(big->config());
  EXPECT_NE(s.message().find("predictor fc1"), std::string::npos) << s;
}

}  // namespace
}  // namespace thermocline
