// TEAL's input-sparse products (sparsity/teal.h) against references: the kernel against a
// double-precision sum over the kept inputs, for every weight type, odd shapes and empty / all /
// random kept sets at several pool sizes; the executor inside the forward pass against the
// dense pass (0% is dense bit for bit, prompt positions stay dense, a sparse batch equals the
// same positions decoded one by one); the plan's flags and the profile file's validation.
#include "shared/sparsity/teal.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul.h"
#include "shared/model/synth.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/sparsity/sparsity_setup.h"
#include "shared/sparsity/teal_profile.h"
#include "shared/util/fp16.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

std::string Name(GgmlType t) { return std::string(TypeTraits(t).name); }

struct TestMatrix {
  std::vector<uint8_t> bytes;
  MatrixView view;
};

TestMatrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestMatrix m;
  const int64_t rb = RowBytes(type, cols);
  m.bytes.assign(rows * rb, 0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> src(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : src) v = normal(rng);
    QuantizeRow(type, src.data(), m.bytes.data() + r * rb, cols);
  }
  m.view = MatrixView{type, rows, cols, m.bytes.data(), rb};
  return m;
}

// Summing k products in f32 in any order, each product and each addition rounded once (or
// fused), errs by at most gamma_{k+1} * sum |w x| with gamma_n = n u / (1 - n u), u = 2^-24
// (Higham, Accuracy and Stability, 3.1). Twice that, for the compiler's freedom to fuse.
double Bound(int64_t kept, double sum_abs) {
  const double n = static_cast<double>(kept + 1);
  const double u = 0x1p-24;
  return 2 * (n * u / (1 - n * u)) * sum_abs + 1e-30;
}

// What IntAxpyRows' 8-bit rounding of the coefficients may add to output j of a Q4_0 copy's
// input-sparse product (kernels/matmul.h): per kept input c, half a step of its group's scale
// (at most max_c |x_c d_c| / 127 over all kept inputs) times |q_cj - 8|, with slack for the
// scale's own rounding and the f32 additions of the rounded terms. 0 for other types.
double IntRounding(const MatrixView& t, const std::vector<float>& x, float cut, int64_t j) {
  if (!HasIntAxpy(t.type)) return 0;
  const int64_t b = j / 32;
  auto block = [&](int64_t c) { return t.data + c * t.row_bytes + b * sizeof(BlockQ4_0); };
  auto kept = [&](int64_t c) { return x[c] != 0 && std::fabs(x[c]) >= cut; };
  double amax = 0;
  for (int64_t c = 0; c < t.rows; ++c) {
    uint16_t d;
    std::memcpy(&d, block(c), 2);
    if (kept(c)) amax = std::max(amax, std::fabs(static_cast<double>(x[c] * Fp16ToFp32(d))));
  }
  double sum = 0;
  for (int64_t c = 0; c < t.rows; ++c) {
    if (!kept(c)) continue;
    const uint8_t u = block(c)[2 + j % 16];
    sum += std::abs(((j % 32) < 16 ? (u & 0x0F) : (u >> 4)) - 8);
  }
  return amax / 254 * sum * (1 + 1e-3);
}

// Input-sparse product of a transposed copy against the double sum over the kept inputs of the
// very values the copy holds.
TEST(TealKernelTest, InputSparseMatVecMatchesDoubleReference) {
  std::mt19937 rng(5);
  struct Shape {
    int64_t out, in;
  };
  for (GgmlType type :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const bool quant = TypeTraits(type).block_size > 1;
    // Outputs run along the transposed rows: whole blocks for the quantized types.
    const std::vector<Shape> shapes =
        // The last shapes hold more than 256 KiB of kept rows (ThreadPool::kMinParallelBytes):
        // they are summed in 2-4 shares of the kept inputs.
        quant ? std::vector<Shape>{{32, 1}, {32, 19}, {64, 45}, {96, 7}, {2080, 160}, {2048, 1024}}
              : std::vector<Shape>{{1, 1}, {37, 19}, {64, 45}, {5, 200}, {3, 1}, {1000, 300}};
    for (const Shape& sh : shapes) {
      // W is [out][in] as a model stores it; its transposed copy is what TEAL reads.
      const int64_t in_cols = quant ? ((sh.in + 31) / 32) * 32 : sh.in;
      TestMatrix w = MakeMatrix(type, sh.out, in_cols, rng);
      w.view.cols = in_cols;
      ThreadPool build(1);
      auto wt = DownRows::ForMatrix(w.view, std::nullopt, build);
      ASSERT_TRUE(wt.ok()) << wt.status();
      const MatrixView& t = wt->view();
      ASSERT_EQ(t.rows, in_cols);
      ASSERT_EQ(t.cols, sh.out);
      std::vector<float> deq(t.rows * t.cols);
      for (int64_t r = 0; r < t.rows; ++r) DequantizeMatrixRow(t, r, deq.data() + r * t.cols);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> x(t.rows);
      for (float& v : x) v = normal(rng);
      if (t.rows > 2) x[1] = 0.0f;  // an exact zero: skipped at every cut
      std::vector<float> mags(t.rows);
      for (int64_t c = 0; c < t.rows; ++c) mags[c] = std::fabs(x[c]);
      std::vector<float> sorted = mags;
      std::sort(sorted.begin(), sorted.end());
      const float median = sorted[sorted.size() / 2];
      for (float cut : {0.0f, median, sorted.back(), std::numeric_limits<float>::infinity()}) {
        std::vector<float> first;  // the result at one thread: every pool size gives its bits
        for (int threads : {1, 3}) {
          ThreadPool pool(threads);
          std::vector<int32_t> ids;
          std::vector<float> coeffs;
          std::vector<float> y(t.cols, 7.0f);
          const int64_t kept = InputSparseMatVec(t, x.data(), cut, ids, coeffs, y.data(), pool);
          int64_t want_kept = 0;
          for (float m : mags) want_kept += m >= cut && m > 0 ? 1 : 0;
          EXPECT_EQ(kept, want_kept) << Name(type) << " cut " << cut;
          if (first.empty()) {
            first = y;
          } else {
            EXPECT_EQ(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)), 0)
                << Name(type) << " " << sh.out << "x" << sh.in << " cut " << cut;
          }
          for (int64_t j = 0; j < t.cols; ++j) {
            double ref = 0, sum_abs = 0;
            for (int64_t c = 0; c < t.rows; ++c) {
              if (mags[c] < cut) continue;
              const double p = static_cast<double>(x[c]) * deq[c * t.cols + j];
              ref += p;
              sum_abs += std::fabs(p);
            }
            EXPECT_LE(std::fabs(y[j] - ref), Bound(kept, sum_abs) + IntRounding(t, x, cut, j))
                << Name(type) << " " << sh.out << "x" << sh.in << " cut " << cut << " threads "
                << threads << " output " << j;
          }
        }
      }
    }
  }
}

TEST(TealKernelTest, TopShareCutDropsTheSmallestShare) {
  std::mt19937 rng(9);
  std::vector<uint32_t> scratch;
  for (int64_t n : {1, 2, 7, 64, 301}) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    for (float share : {0.0f, 0.25f, 0.5f, 0.9f, 0.999f}) {
      const float cut = TopShareCut(x.data(), n, share, scratch);
      int64_t dropped = 0;
      for (float v : x) dropped += std::fabs(v) < cut ? 1 : 0;
      // Distinct magnitudes: exactly floor(share * n) fall under the cut.
      EXPECT_EQ(dropped, static_cast<int64_t>(std::floor(static_cast<double>(share) * n)))
          << "n " << n << " share " << share;
    }
  }
}

// The cut is the floor(share * n)-th smallest magnitude exactly (a sort's), with ties, zeros of
// both signs, subnormals, infinities and magnitudes that share their leading bits (the radix
// select's digits), at the 1.3B shape's widths.
TEST(TealKernelTest, TopShareCutIsTheSortedMagnitude) {
  std::mt19937 rng(21);
  std::vector<uint32_t> scratch;
  const float specials[] = {0.0f,
                            -0.0f,
                            1e-40f,
                            -1e-40f,
                            INFINITY,
                            -INFINITY,
                            1.0f,
                            -1.0f,
                            std::nextafter(1.0f, 2.0f),
                            std::nextafter(1.0f, 0.0f)};
  for (int64_t n : {3, 100, 2048, 5504}) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> x(n);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::uniform_int_distribution<int> pick(0, std::size(specials) - 1);
      for (float& v : x) {
        if (kind == 0) v = normal(rng) * std::exp(3.0f * normal(rng));  // wide exponents
        if (kind == 1) v = specials[pick(rng)];                         // ties and specials
        // One exponent and close mantissas: only the lower digits tell them apart.
        if (kind == 2) v = (pick(rng) % 2 ? 1.0f : -1.0f) * (1.0f + (pick(rng) * 3 % 7) * 1e-6f);
      }
      std::vector<float> sorted(n);
      for (int64_t i = 0; i < n; ++i) sorted[i] = std::fabs(x[i]);
      std::sort(sorted.begin(), sorted.end());
      for (float share : {0.1f, 0.5f, 0.75f, 0.999f}) {
        const int64_t k = static_cast<int64_t>(std::floor(static_cast<double>(share) * n));
        const float want = k == 0 ? 0.0f : sorted[k];
        const float got = TopShareCut(x.data(), n, share, scratch);
        EXPECT_EQ(std::memcmp(&got, &want, sizeof(got)), 0)
            << "n " << n << " kind " << kind << " share " << share << ": " << got << " vs " << want;
      }
    }
  }
}

std::unique_ptr<Model> Synth(GgmlType type, SynthFfnKind kind, const std::string& name) {
  return testing::SmallSynthModel(type, kind, name);
}

// Logits of a prompt batch and then single-position decode steps (greedy-free: fixed tokens).
std::vector<std::vector<float>> RunSequence(const Model& model, LinearExecutor* linear,
                                            ThreadPool& pool, int64_t prompt, int64_t decode) {
  auto kv = KvCache::Create(model.config(), 1, 32, GgmlType::kF32);
  EXPECT_TRUE(kv.ok());
  ForwardPass pass(model, *kv, pool, nullptr, linear);
  std::vector<std::vector<float>> out;
  std::vector<BatchEntry> batch;
  for (int64_t p = 0; p < prompt; ++p) {
    batch.push_back({0, static_cast<int32_t>(p), static_cast<int32_t>((p * 37 + 11) % 300), true});
  }
  std::vector<float> logits;
  EXPECT_TRUE(pass.Run(batch, logits).ok());
  out.push_back(logits);
  for (int64_t p = prompt; p < prompt + decode; ++p) {
    BatchEntry e{0, static_cast<int32_t>(p), static_cast<int32_t>((p * 37 + 11) % 300), true};
    EXPECT_TRUE(pass.Run(std::span<const BatchEntry>(&e, 1), logits).ok());
    out.push_back(logits);
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// 0% drops nothing: the executor takes the model's own MatMul for every projection.
TEST(TealForwardTest, ZeroSparsityIsDenseBitForBit) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ4_0}) {
    auto model = Synth(type, SynthFfnKind::kSwiGlu, "zero_" + Name(type));
    ASSERT_TRUE(model);
    ThreadPool pool(2);
    const auto dense = RunSequence(*model, nullptr, pool, 5, 4);
    for (TealPlan::Kind kind : {TealPlan::Kind::kTopShare, TealPlan::Kind::kCuts}) {
      TealPlan plan = TealPlan::TopShare(model->config().n_layers, 0.0f);
      plan.kind = kind;
      auto teal = TealLinear::Create(*model, plan, pool);
      ASSERT_TRUE(teal.ok()) << teal.status();
      const auto got = RunSequence(*model, teal->get(), pool, 5, 4);
      ASSERT_EQ(got.size(), dense.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBits(got[i], dense[i])) << i;
      EXPECT_EQ((*teal)->owned_bytes(), 0);  // nothing sparsified, nothing transposed
    }
  }
}

// Prompt positions stay dense (bit for bit); decode positions are input-sparse and counted.
TEST(TealForwardTest, PromptDenseDecodeSparse) {
  auto model = Synth(GgmlType::kF16, SynthFfnKind::kSwiGlu, "prompt_f16");
  ASSERT_TRUE(model);
  const int64_t n_layers = model->config().n_layers;
  ThreadPool pool(2);
  const auto dense = RunSequence(*model, nullptr, pool, 6, 3);
  auto teal = TealLinear::Create(*model, TealPlan::TopShare(n_layers, 0.5f), pool);
  ASSERT_TRUE(teal.ok()) << teal.status();
  const auto got = RunSequence(*model, teal->get(), pool, 6, 3);
  EXPECT_TRUE(SameBits(got[0], dense[0]));
  for (size_t i = 1; i < got.size(); ++i) EXPECT_FALSE(SameBits(got[i], dense[i])) << i;
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int p = 0; p < kNumProjections; ++p) {
      const ProjectionActivity& a = (*teal)->activity(l, static_cast<Projection>(p));
      EXPECT_EQ(a.sparse_rows, 3) << l << " " << p;
      // Half of each row's inputs (distinct magnitudes) go.
      EXPECT_EQ(a.inputs - a.kept, a.inputs / 2) << l << " " << p;
    }
  }
  EXPECT_NEAR((*teal)->MeasuredSparsity(), 0.5, 1e-9);
}

// With every position sparse, a batch computes each position as a decode step computes it.
TEST(TealForwardTest, SparseBatchEqualsDecodeOneByOne) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
    auto model = Synth(type, SynthFfnKind::kSwiGlu, "batch_" + Name(type));
    ASSERT_TRUE(model);
    ThreadPool pool(2);
    TealPlan plan = TealPlan::TopShare(model->config().n_layers, 0.4f);
    plan.sparse_prompt = true;
    auto teal = TealLinear::Create(*model, plan, pool);
    ASSERT_TRUE(teal.ok()) << teal.status();
    const auto batch = RunSequence(*model, teal->get(), pool, 7, 0);
    const auto single = RunSequence(*model, teal->get(), pool, 1, 6);
    const int64_t vocab = model->config().vocab_size;
    std::vector<float> joined;
    for (const auto& l : single) joined.insert(joined.end(), l.begin(), l.end());
    ASSERT_EQ(joined.size(), static_cast<size_t>(7 * vocab));
    EXPECT_TRUE(SameBits(batch[0], joined)) << Name(type);
  }
}

// Apply's sparse rows against the dense product of the masked input in double, for each
// projection of a layer (the executor's transposition, mask and row routing together), with
// calibrated cuts and with per-token top shares. The projections' inputs differ, except that
// v's repeats k's (the executor reuses a top-share cut for the same values, never for others).
TEST(TealForwardTest, ApplyEqualsMaskedDenseProduct) {
  auto model = Synth(GgmlType::kF32, SynthFfnKind::kSwiGlu, "apply_f32");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  ThreadPool pool(2);
  for (TealPlan::Kind kind : {TealPlan::Kind::kCuts, TealPlan::Kind::kTopShare}) {
    const bool cuts = kind == TealPlan::Kind::kCuts;
    TealPlan plan = TealPlan::TopShare(c.n_layers, 0.0f);
    plan.kind = kind;
    for (auto& v : plan.values) v.fill(cuts ? 0.6f : 0.5f);
    auto teal = TealLinear::Create(*model, plan, pool);
    ASSERT_TRUE(teal.ok()) << teal.status();
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const uint8_t decode[3] = {1, 0, 1};
    (*teal)->BeginBatch(decode);
    const LayerWeights& lw = model->layer(1);
    const MatrixView mats[] = {lw.wq, lw.wk, lw.wv, lw.wo, lw.gate, lw.up, lw.down};
    std::vector<float> x;
    for (int p = 0; p < kNumProjections; ++p) {
      const MatrixView& w = mats[p];
      std::vector<float> y(3 * w.rows), dense(3 * w.rows);
      if (static_cast<Projection>(p) != Projection::kV) {
        x.resize(3 * w.cols);
        for (float& v : x) v = normal(rng);
      }
      (*teal)->Apply(1, static_cast<Projection>(p), w, false, x.data(), 3, w.cols, y.data(),
                     w.rows);
      MatMul(w, x.data(), 3, w.cols, dense.data(), w.rows, pool);
      std::vector<float> row(w.cols);
      for (int t = 0; t < 3; ++t) {
        if (!decode[t]) {
          EXPECT_EQ(
              std::memcmp(y.data() + t * w.rows, dense.data() + t * w.rows, w.rows * sizeof(float)),
              0);
          continue;
        }
        std::vector<uint32_t> scratch;
        const float cut = cuts ? 0.6f : TopShareCut(x.data() + t * w.cols, w.cols, 0.5f, scratch);
        for (int64_t r = 0; r < w.rows; ++r) {
          DequantizeMatrixRow(w, r, row.data());
          double ref = 0, sum_abs = 0;
          int64_t kept = 0;
          for (int64_t i = 0; i < w.cols; ++i) {
            const float xi = x[t * w.cols + i];
            if (std::fabs(xi) < cut) continue;
            ++kept;
            ref += static_cast<double>(xi) * row[i];
            sum_abs += std::fabs(static_cast<double>(xi) * row[i]);
          }
          EXPECT_LE(std::fabs(y[t * w.rows + r] - ref), Bound(kept, sum_abs))
              << ProjectionName(static_cast<Projection>(p)) << " row " << t << " out " << r
              << (cuts ? " (cuts)" : " (top share)");
        }
      }
    }
  }
}

// The plans the group tests run: 0 calibrated cuts of 0.6, 1 top shares of 0.5, 2 cuts of
// 0.6 with layer 1's k and up at their own (0.3, 0.9).
TealPlan VariantPlan(int64_t n_layers, int variant) {
  const bool cuts = variant != 1;
  TealPlan plan = TealPlan::TopShare(n_layers, 0.0f);
  plan.kind = cuts ? TealPlan::Kind::kCuts : TealPlan::Kind::kTopShare;
  for (auto& v : plan.values) v.fill(cuts ? 0.6f : 0.5f);
  if (variant == 2) {
    plan.values[1][static_cast<int>(Projection::kK)] = 0.3f;
    plan.values[1][static_cast<int>(Projection::kUp)] = 0.9f;
  }
  return plan;
}

// q, k, v and gate, up through ApplyShared: with equal values their copies are kept side by
// side (the same bytes as separate copies), and the shared product equals Apply on each
// projection bit for bit (the same kept inputs, each output's sum in the same order), which the
// test above checks against the masked dense product. Prompt rows are MatMul's bits. A group
// with different cuts keeps separate copies and goes one by one, each with its own cut.
TEST(TealForwardTest, SharedProductsEqualApplyPerProjection) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ4_0}) {
    auto model = Synth(type, SynthFfnKind::kSwiGlu, "shared");
    ASSERT_TRUE(model);
    const ModelConfig& c = model->config();
    ThreadPool pool(2);
    for (int variant = 0; variant < 3; ++variant) {
      const bool mixed = variant == 2;
      const TealPlan plan = VariantPlan(c.n_layers, variant);
      auto teal = TealLinear::Create(*model, plan, pool);
      ASSERT_TRUE(teal.ok()) << teal.status();
      // The side-by-side copies hold what separate ones would.
      int64_t separate = 0;
      const LayerWeights& lw = model->layer(1);
      for (int64_t l = 0; l < c.n_layers; ++l) {
        const LayerWeights& w = model->layer(l);
        for (const MatrixView* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.gate, &w.up, &w.down}) {
          auto copy = DownRows::ForMatrix(*m, std::nullopt, pool);
          ASSERT_TRUE(copy.ok());
          separate += copy->owned_bytes();
        }
      }
      EXPECT_EQ((*teal)->owned_bytes(), separate) << Name(type);
      // Side by side where the group's values are equal; a calibrated plan's differ.
      for (int64_t l = 0; l < c.n_layers; ++l) {
        for (int p = 0; p < kNumProjections; ++p) {
          const auto proj = static_cast<Projection>(p);
          const bool grouped = proj != Projection::kO && proj != Projection::kDown;
          const bool qkv = p <= static_cast<int>(Projection::kV);
          EXPECT_EQ((*teal)->reads_shared_copy(l, proj), grouped && !(mixed && l == 1))
              << ProjectionName(proj) << " layer " << l << (qkv ? " (qkv)" : "");
        }
      }
      std::mt19937 rng(8);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const uint8_t decode[3] = {1, 0, 1};
      (*teal)->BeginBatch(decode);
      for (const std::vector<Projection>& group :
           {std::vector<Projection>{Projection::kQ, Projection::kK, Projection::kV},
            std::vector<Projection>{Projection::kGate, Projection::kUp}}) {
        std::vector<float> x(3 * c.dim);
        for (float& v : x) v = normal(rng);
        std::vector<std::vector<float>> got(group.size()), want(group.size()), dense(group.size());
        std::vector<LinearExecutor::Output> outs;
        const MatrixView* mats[] = {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.gate, &lw.up, &lw.down};
        for (size_t i = 0; i < group.size(); ++i) {
          const MatrixView& w = *mats[static_cast<int>(group[i])];
          got[i].assign(3 * w.rows, -1.0f);
          want[i].assign(3 * w.rows, -2.0f);
          dense[i].resize(3 * w.rows);
          outs.push_back({group[i], &w, got[i].data(), w.rows});
        }
        (*teal)->ResetActivity();
        (*teal)->ApplyShared(1, outs, x.data(), 3, c.dim);
        std::vector<int64_t> kept;
        for (Projection p : group) kept.push_back((*teal)->activity(1, p).kept);
        (*teal)->ResetActivity();
        for (size_t i = 0; i < group.size(); ++i) {
          const MatrixView& w = *outs[i].w;
          (*teal)->Apply(1, group[i], w, false, x.data(), 3, c.dim, want[i].data(), w.rows);
          EXPECT_EQ(kept[i], (*teal)->activity(1, group[i]).kept) << Name(type);
          EXPECT_TRUE(SameBits(got[i], want[i]))
              << Name(type) << " " << ProjectionName(group[i]) << " variant " << variant;
          MatMul(w, x.data(), 3, c.dim, dense[i].data(), w.rows, pool);
          EXPECT_EQ(
              std::memcmp(got[i].data() + w.rows, dense[i].data() + w.rows, w.rows * sizeof(float)),
              0)
              << "prompt row " << ProjectionName(group[i]);
          // The decode rows are sparse: they differ from dense.
          EXPECT_NE(std::memcmp(got[i].data(), dense[i].data(), w.rows * sizeof(float)), 0);
        }
        if (mixed) {
          EXPECT_NE(kept[0], kept[1]) << "own cuts";
        } else {
          for (int64_t k : kept) EXPECT_EQ(k, kept[0]) << "one kept set";
        }
      }
    }
  }
}

// TealPlan::masked (the calibration's trials): a sparse row is MatMul's product of its input
// with the dropped entries zeroed, bit for bit, through Apply and ApplyShared alike (equal
// values share one masked input, different ones mask each projection's own), and the kept
// inputs are counted as the input-sparse kernels count them. Dense rows are MatMul's bits.
TEST(TealForwardTest, MaskedRowsAreMatMulOfTheMaskedInput) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ4_0}) {
    auto model = Synth(type, SynthFfnKind::kSwiGlu, "masked_" + Name(type));
    ASSERT_TRUE(model);
    const ModelConfig& c = model->config();
    ThreadPool pool(2);
    for (int variant = 0; variant < 3; ++variant) {
      const bool cuts = variant != 1;
      TealPlan plan = VariantPlan(c.n_layers, variant);
      plan.masked = true;
      auto teal = TealLinear::Create(*model, plan, pool);
      ASSERT_TRUE(teal.ok()) << teal.status();
      const uint8_t decode[3] = {1, 0, 1};
      (*teal)->BeginBatch(decode);
      const LayerWeights& lw = model->layer(1);
      const MatrixView* mats[] = {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.gate, &lw.up, &lw.down};
      std::mt19937 rng(5);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      // MatMul of x with each decode row's entries under the projection's cut zeroed.
      auto want = [&](Projection p, const std::vector<float>& x, int64_t* kept) {
        const MatrixView& w = *mats[static_cast<int>(p)];
        const float value = plan.values[1][static_cast<int>(p)];
        std::vector<float> xm = x;
        *kept = 0;
        for (int t = 0; t < 3; ++t) {
          if (!decode[t]) continue;
          std::vector<uint32_t> scratch;
          const float cut =
              cuts ? value : TopShareCut(x.data() + t * w.cols, w.cols, value, scratch);
          for (int64_t i = 0; i < w.cols; ++i) {
            float& v = xm[t * w.cols + i];
            if (std::fabs(v) < cut || v == 0) {
              v = 0;
            } else {
              ++*kept;
            }
          }
        }
        std::vector<float> y(3 * w.rows);
        MatMul(w, xm.data(), 3, w.cols, y.data(), w.rows, pool);
        return y;
      };
      for (const std::vector<Projection>& group :
           {std::vector<Projection>{Projection::kQ, Projection::kK, Projection::kV},
            std::vector<Projection>{Projection::kGate, Projection::kUp},
            std::vector<Projection>{Projection::kO}, std::vector<Projection>{Projection::kDown}}) {
        const MatrixView& w0 = *mats[static_cast<int>(group[0])];
        std::vector<float> x(3 * w0.cols);
        for (float& v : x) v = normal(rng);
        x[5] = 0.0f;  // a zero is dropped at any cut
        std::vector<std::vector<float>> got(group.size());
        std::vector<LinearExecutor::Output> outs;
        for (size_t i = 0; i < group.size(); ++i) {
          const MatrixView& w = *mats[static_cast<int>(group[i])];
          got[i].assign(3 * w.rows, -1.0f);
          outs.push_back({group[i], &w, got[i].data(), w.rows});
        }
        for (bool shared : {true, false}) {
          (*teal)->ResetActivity();
          if (shared) {
            (*teal)->ApplyShared(1, outs, x.data(), 3, w0.cols);
          } else {
            for (const auto& o : outs) {
              (*teal)->Apply(1, o.p, *o.w, false, x.data(), 3, w0.cols, o.y, o.y_stride);
            }
          }
          for (size_t i = 0; i < group.size(); ++i) {
            int64_t kept = 0;
            EXPECT_TRUE(SameBits(got[i], want(group[i], x, &kept)))
                << Name(type) << " " << ProjectionName(group[i]) << " variant " << variant
                << (shared ? " shared" : " apply");
            const ProjectionActivity& a = (*teal)->activity(1, group[i]);
            EXPECT_EQ(a.kept, kept) << ProjectionName(group[i]);
            EXPECT_EQ(a.sparse_rows, 2);
            EXPECT_EQ(a.inputs, 2 * w0.cols);
          }
        }
      }
    }
  }
}

TEST(TealPlanTest, FlagsNameWhatIsWrong) {
  auto model = Synth(GgmlType::kF32, SynthFfnKind::kReluGated, "flags_relu");
  ASSERT_TRUE(model);
  auto check = [&](const std::string& mode, TealFlags f, const std::string& needle) {
    auto r = TealPlanFromFlags(*model, mode, f);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  check("teal", {}, "--teal-sparsity");
  check("teal", {.sparsity = 1.5f}, "[0, 1)");
  check("dense", {.sparsity = 0.5f}, "--sparsity teal");
  check("teal", {.sparsity = 0.5f, .profile_path = "/nonexistent/teal.gguf"}, "--teal-profile");
  // A file of another kind is named as such.
  check("teal", {.sparsity = 0.5f, .profile_path = model->file().path()}, "teal-calibrate");

  auto all = TealPlanFromFlags(*model, "teal", {.sparsity = 0.25f});
  ASSERT_TRUE(all.ok() && all->has_value()) << all.status();
  EXPECT_TRUE((*all)->ffn);
  EXPECT_EQ((*all)->value(0, Projection::kDown), 0.25f);
  auto attn = TealPlanFromFlags(*model, "exact", {.sparsity = 0.25f});
  ASSERT_TRUE(attn.ok() && attn->has_value()) << attn.status();
  EXPECT_FALSE((*attn)->ffn);
  EXPECT_EQ((*attn)->value(1, Projection::kO), 0.25f);
  EXPECT_EQ((*attn)->value(1, Projection::kGate), 0.0f);
  auto off = TealPlanFromFlags(*model, "dense", {});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->has_value());

  // The setup reads `teal` as the dense FFN (it runs in DenseFfn, through TEAL's executor) and
  // an FFN mode as itself, with TEAL on attention.
  const SparsityFlags teal_mode{.mode = "teal"};
  auto whole = SparsitySetupFromFlags(*model, teal_mode, {.sparsity = 0.25f});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(whole->ffn.AllDense());
  ASSERT_TRUE(whole->teal.has_value());
  EXPECT_TRUE(whole->teal->ffn);
  EXPECT_EQ(teal_mode.mode, "teal");
  auto exact = SparsitySetupFromFlags(*model, {.mode = "exact"}, {.sparsity = 0.25f});
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_FALSE(exact->ffn.AllDense());
  ASSERT_TRUE(exact->teal.has_value());
  EXPECT_FALSE(exact->teal->ffn);
  auto dense = SparsitySetupFromFlags(*model, {}, {});
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_TRUE(dense->ffn.AllDense());
  EXPECT_FALSE(dense->teal.has_value());
  // Errors of either part come through, naming the flag.
  auto no_share = SparsitySetupFromFlags(*model, teal_mode, {});
  ASSERT_FALSE(no_share.ok());
  EXPECT_NE(no_share.status().message().find("--teal-sparsity"), std::string::npos);
  auto no_stats = SparsitySetupFromFlags(*model, {.mode = "threshold"}, {});
  ASSERT_FALSE(no_stats.ok());
  EXPECT_NE(no_stats.status().message().find("--stats"), std::string::npos);
  // The executors: TEAL's always, the sparse FFN only where the FFN's plan is not dense.
  ThreadPool pool(1);
  auto whole_exec = BuildLocalExecutors(*model, std::move(*whole), pool);
  ASSERT_TRUE(whole_exec.ok()) << whole_exec.status();
  EXPECT_EQ(whole_exec->ffn, nullptr);
  EXPECT_NE(whole_exec->teal, nullptr);
  auto exact_exec = BuildLocalExecutors(*model, std::move(*exact), pool);
  ASSERT_TRUE(exact_exec.ok()) << exact_exec.status();
  EXPECT_NE(exact_exec->ffn, nullptr);
  EXPECT_NE(exact_exec->teal, nullptr);

  TealPlan bad = TealPlan::TopShare(2, 0.5f);
  bad.values[1][3] = 1.0f;
  absl::Status s = bad.Validate(model->config());
  EXPECT_NE(s.message().find("layer 1 projection o"), std::string::npos) << s;
}

TealProfile SmallProfile(int64_t n_layers, int64_t dim) {
  TealProfile p;
  p.tokens = 1000;
  p.greedy_tokens = 255;
  p.dim = dim;
  p.targets = {0.25f, 0.5f};
  p.layers.resize(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int i = 0; i < kNumTealInputs; ++i) {
      for (int k = 0; k < kTealQuantiles; ++k) p.layers[l].quantiles[i][k] = 0.01f * k * (i + 1);
    }
    for (float t : p.targets) {
      ProjectionValues s, cut;
      for (int q = 0; q < kNumProjections; ++q) {
        s[q] = t + 0.01f * q;
        cut[q] = p.CutFor(l, InputOf(static_cast<Projection>(q)), s[q]);
      }
      p.layers[l].sparsity.push_back(s);
      p.layers[l].cuts.push_back(cut);
    }
  }
  return p;
}

TEST(TealProfileTest, RoundTripAndShapeChecks) {
  auto model = Synth(GgmlType::kF32, SynthFfnKind::kSwiGlu, "profile_silu");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const TealProfile p = SmallProfile(c.n_layers, c.dim);
  // Between percentiles the cut is linear: 37.5% of input 1 sits between 0.74 and 0.76.
  EXPECT_NEAR(p.CutFor(0, TealInput::kAttnOut, 0.375f), 0.75f, 1e-6);
  const std::string path = testing::TempDir() + "/teal_profile.gguf";
  ASSERT_TRUE(WriteTealProfile(p, path).ok());
  auto back = ReadTealProfile(path, &c);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->targets, p.targets);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(back->layers[l].quantiles, p.layers[l].quantiles);
    EXPECT_EQ(back->layers[l].cuts, p.layers[l].cuts);
    EXPECT_EQ(back->layers[l].sparsity, p.layers[l].sparsity);
  }
  auto plan = back->PlanFor(0.5f);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->values[1], p.layers[1].cuts[1]);
  auto missing = back->PlanFor(0.4f);
  EXPECT_NE(missing.status().message().find("0.25, 0.5"), std::string::npos) << missing.status();

  ModelConfig other = c;
  other.n_layers = c.n_layers + 1;
  auto wrong = ReadTealProfile(path, &other);
  EXPECT_NE(wrong.status().message().find("layers"), std::string::npos) << wrong.status();
  // Quantiles must be ascending (a corrupted or hand-edited file).
  TealProfile bad = p;
  bad.layers[1].quantiles[2][50] = 100.0f;
  ASSERT_TRUE(WriteTealProfile(bad, path).ok());
  auto refused = ReadTealProfile(path, &c);
  EXPECT_NE(refused.status().message().find("blk.1.teal_quantiles is not ascending"),
            std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace thermocline
