// Predictors (sparsity/predictor.h): scores and active ids against a double-precision reference,
// PowerInfer-style files, shape errors, write/read round trips; and the trainer's pieces
// (sparsity/predictor_trainer.h) on synthetic samples whose truth is known.
#include "shared/sparsity/predictor.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/gguf/quant.h"
#include "shared/sparsity/predictor_trainer.h"
#include "shared/util/fp16.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

void ExpectError(const absl::Status& s, const std::string& substr) {
  EXPECT_FALSE(s.ok()) << "expected an error containing: " << substr;
  EXPECT_NE(std::string(s.message()).find(substr), std::string::npos)
      << "message: " << s.message() << "\nexpected to contain: " << substr;
}

ModelConfig SmallConfig(int64_t dim = 64, int64_t ffn = 96, int64_t layers = 2) {
  ModelConfig c;
  c.dim = dim;
  c.ffn_dim = ffn;
  c.n_layers = layers;
  c.activation = FfnActivation::kRelu;
  c.context_length = 256;
  return c;
}

std::vector<float> RandomVector(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<PredictorWeights> RandomWeights(const ModelConfig& c, std::vector<int64_t> ranks,
                                            uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<PredictorWeights> out;
  for (int64_t r : ranks) {
    PredictorWeights w;
    w.rank = r;
    w.fc1 = RandomVector(rng, r * c.dim, 1.0f / std::sqrt(static_cast<float>(c.dim)));
    w.fc2 = RandomVector(rng, c.ffn_dim * r, 1.0f / std::sqrt(static_cast<float>(r)));
    out.push_back(std::move(w));
  }
  return out;
}

// Weights as a type stores them (what a loaded file computes with).
std::vector<float> Rounded(const std::vector<float>& v, GgmlType type) {
  std::vector<uint8_t> bytes(RowBytes(type, static_cast<int64_t>(v.size())));
  std::vector<float> out(v.size());
  QuantizeRow(type, v.data(), bytes.data(), static_cast<int64_t>(v.size()));
  DequantizeRow(type, bytes.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}

// score = fc2 . relu(fc1 . h) in double.
std::vector<double> ReferenceScores(const std::vector<float>& fc1, const std::vector<float>& fc2,
                                    int64_t rank, const ModelConfig& c, const float* h) {
  std::vector<double> hidden(rank), scores(c.ffn_dim);
  for (int64_t k = 0; k < rank; ++k) {
    double s = 0;
    for (int64_t j = 0; j < c.dim; ++j) s += static_cast<double>(fc1[k * c.dim + j]) * h[j];
    hidden[k] = std::max(s, 0.0);
  }
  for (int64_t i = 0; i < c.ffn_dim; ++i) {
    double s = 0;
    for (int64_t k = 0; k < rank; ++k) s += static_cast<double>(fc2[i * rank + k]) * hidden[k];
    scores[i] = s;
  }
  return scores;
}

// Checks Scores and Predict of `set` against the reference computed from `weights` (already
// rounded to the stored type), at the set's per-layer thresholds.
void ExpectMatchesReference(const PredictorSet& set, const std::vector<PredictorWeights>& weights,
                            const ModelConfig& c, ThreadPool& pool) {
  std::mt19937 rng(7);
  for (int64_t l = 0; l < set.n_layers(); ++l) {
    for (int trial = 0; trial < 4; ++trial) {
      const std::vector<float> h = RandomVector(rng, c.dim, 1.0f);
      const std::vector<double> ref =
          ReferenceScores(weights[l].fc1, weights[l].fc2, weights[l].rank, c, h.data());
      std::vector<float> scores(c.ffn_dim);
      set.Scores(l, h.data(), 1, scores.data(), pool);
      double max_ref = 0;
      for (double s : ref) max_ref = std::max(max_ref, std::abs(s));
      const double tol = 1e-5 * (1 + max_ref);
      for (int64_t i = 0; i < c.ffn_dim; ++i) {
        ASSERT_NEAR(scores[i], ref[i], tol) << "layer " << l << " neuron " << i;
      }
      std::vector<int32_t> active = {123, 456};  // Predict must replace, not append
      set.Predict(l, h.data(), &active, pool);
      const float t = set.layer_threshold(l);
      std::vector<int32_t> expected;
      for (int64_t i = 0; i < c.ffn_dim; ++i) {
        if (ref[i] >= t) expected.push_back(static_cast<int32_t>(i));
      }
      // Neurons within rounding of the threshold may go either way; every other must agree.
      size_t a = 0, e = 0;
      while (a < active.size() || e < expected.size()) {
        const int32_t id = a < active.size() && (e >= expected.size() || active[a] < expected[e])
                               ? active[a]
                               : expected[e];
        const bool in_a = a < active.size() && active[a] == id;
        const bool in_e = e < expected.size() && expected[e] == id;
        if (in_a != in_e) {
          EXPECT_LT(std::abs(ref[id] - t), tol) << "layer " << l << " neuron " << id;
        }
        a += in_a;
        e += in_e;
      }
      for (size_t i = 1; i < active.size(); ++i) ASSERT_LT(active[i - 1], active[i]);
    }
  }
}

std::vector<PredictorWeights> RoundedWeights(std::vector<PredictorWeights> w, GgmlType type) {
  for (PredictorWeights& p : w) {
    p.fc1 = Rounded(p.fc1, type);
    p.fc2 = Rounded(p.fc2, type);
  }
  return w;
}

TEST(PredictorSetTest, F32MatchesDoubleReference) {
  const ModelConfig c = SmallConfig();
  const auto weights = RandomWeights(c, {16, 24}, 1);
  auto set = PredictorSet::FromWeights(weights, c, GgmlType::kF32, 0.1f);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->n_layers(), 2);
  EXPECT_EQ(set->layer(0).rank, 16);
  EXPECT_EQ(set->layer(1).rank, 24);
  EXPECT_FLOAT_EQ(set->threshold(), 0.1f);
  EXPECT_EQ(set->bytes(), (16 + 24) * (64 + 96) * 4);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    ExpectMatchesReference(*set, weights, c, pool);
  }
}

TEST(PredictorSetTest, F16AndPerLayerThresholds) {
  const ModelConfig c = SmallConfig();
  const auto weights = RandomWeights(c, {32, 8}, 2);
  auto set = PredictorSet::FromWeights(weights, c, GgmlType::kF16);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_TRUE(set->set_layer_thresholds({-0.5f, 0.75f}).ok());
  EXPECT_TRUE(set->has_per_layer_thresholds());
  ThreadPool pool(2);
  ExpectMatchesReference(*set, RoundedWeights(weights, GgmlType::kF16), c, pool);
  set->set_threshold(0.2f);  // the global threshold applies to every layer again
  EXPECT_FALSE(set->has_per_layer_thresholds());
  EXPECT_FLOAT_EQ(set->layer_threshold(0), 0.2f);
  ExpectMatchesReference(*set, RoundedWeights(weights, GgmlType::kF16), c, pool);
  ExpectError(set->set_layer_thresholds({1.0f}), "1 thresholds for 2 layers");
  ExpectError(set->set_layer_thresholds({1.0f, NAN}), "layer 1 is not finite");
}

TEST(PredictorSetTest, CopiesOwnTheirWeights) {
  const ModelConfig c = SmallConfig();
  const auto weights = RandomWeights(c, {16, 16}, 3);
  PredictorSet copy;
  {
    auto set = PredictorSet::FromWeights(weights, c, GgmlType::kF32, 0.0f);
    ASSERT_TRUE(set.ok());
    copy = *set;
    PredictorSet moved = std::move(*set);
  }
  ThreadPool pool(1);
  ExpectMatchesReference(copy, weights, c, pool);
}

TEST(PredictorSetTest, OneTokenReadsOnlyTheFc2RowsOfNonzeroHiddenUnits) {
  const ModelConfig c = SmallConfig();
  const auto weights = RandomWeights(c, {32, 24}, 5);
  auto set = PredictorSet::FromWeights(weights, c, GgmlType::kF16, 0.0f);
  ASSERT_TRUE(set.ok()) << set.status();
  const auto rounded = RoundedWeights(weights, GgmlType::kF16);
  std::mt19937 rng(11);
  for (int64_t l = 0; l < set->n_layers(); ++l) {
    const LayerPredictor& p = set->layer(l);
    ASSERT_NE(p.fc2_t.data, nullptr);
    EXPECT_EQ(p.fc2_t.rows, p.rank);
    EXPECT_EQ(p.fc2_t.cols, c.ffn_dim);
    const int64_t rank = p.rank;
    const std::vector<float> h = RandomVector(rng, 3 * c.dim, 1.0f);
    // The hidden units ReLU keeps, from the double reference (random data leaves none at 0).
    int64_t nonzero = 0;
    for (int64_t k = 0; k < rank; ++k) {
      double s = 0;
      for (int64_t j = 0; j < c.dim; ++j) s += double(rounded[l].fc1[k * c.dim + j]) * h[j];
      nonzero += s > 0 ? 1 : 0;
    }
    ASSERT_GT(nonzero, 0);
    ASSERT_LT(nonzero, rank);
    std::vector<int32_t> active;
    ThreadPool one(1), two(2);
    const int64_t fc1_bytes = rank * c.dim * 2;
    EXPECT_EQ(set->Predict(l, h.data(), &active, one), fc1_bytes + nonzero * c.ffn_dim * 2);
    // One token's scores do not depend on the pool, and a batch (through fc2) agrees with them
    // to rounding.
    std::vector<float> s1(c.ffn_dim), s2(c.ffn_dim), batch(3 * c.ffn_dim);
    set->Scores(l, h.data(), 1, s1.data(), one);
    set->Scores(l, h.data(), 1, s2.data(), two);
    EXPECT_EQ(s1, s2);
    EXPECT_EQ(set->Scores(l, h.data(), 3, batch.data(), two), fc1_bytes + c.ffn_dim * rank * 2);
    for (int64_t i = 0; i < c.ffn_dim; ++i) {
      EXPECT_NEAR(batch[i], s1[i], 1e-5 * (1 + std::abs(s1[i]))) << "layer " << l << " " << i;
    }
  }
  // Block types keep fc2 alone and read it whole.
  const auto q = RandomWeights(c, {32, 64}, 6);
  auto q8 = PredictorSet::FromWeights(q, c, GgmlType::kQ8_0, 0.0f);
  ASSERT_TRUE(q8.ok()) << q8.status();
  EXPECT_EQ(q8->layer(0).fc2_t.data, nullptr);
  std::vector<int32_t> active;
  ThreadPool pool(1);
  const std::vector<float> h = RandomVector(rng, c.dim, 1.0f);
  EXPECT_EQ(q8->Predict(0, h.data(), &active, pool),
            q8->layer(0).fc1.rows * q8->layer(0).fc1.row_bytes +
                q8->layer(0).fc2.rows * q8->layer(0).fc2.row_bytes);
}

TEST(PredictorSetTest, FromWeightsValidates) {
  const ModelConfig c = SmallConfig();
  auto weights = RandomWeights(c, {16, 16}, 4);
  ExpectError(PredictorSet::FromWeights({weights[0]}, c, GgmlType::kF32).status(),
              "1 layers given, the model has 2");
  auto bad = weights;
  bad[1].fc2.pop_back();
  ExpectError(PredictorSet::FromWeights(bad, c, GgmlType::kF32).status(), "layer 1 has");
  bad = weights;
  bad[0].rank = 0;
  ExpectError(PredictorSet::FromWeights(bad, c, GgmlType::kF32).status(), "rank 0 must be > 0");
  ExpectError(PredictorSet::FromWeights(weights, c, GgmlType::kQ8_0).status(),
              "rank 16 must be > 0 and a multiple of 32");
  bad = weights;
  bad[0].fc2[5] = 1e6f;  // beyond f16's range
  ExpectError(PredictorSet::FromWeights(bad, c, GgmlType::kF16).status(),
              "layer 0 fc2[0][5] = 1e+06 is not finite as f16");
  ExpectError(PredictorSet::FromWeights(weights, c, GgmlType::kI32).status(),
              "i32 is not a weight type");
  ExpectError(PredictorSet::FromWeights(weights, c, GgmlType::kF32, INFINITY).status(),
              "threshold is not finite");
}

// A PowerInfer-style model file: PWRI magic, llama metadata, predictors in F16.
struct PowerInferFile {
  ModelConfig config = SmallConfig();
  std::vector<int64_t> ranks = {32, 16};
  std::vector<PredictorWeights> weights = RandomWeights(config, ranks, 5);
  float threshold = 0.25f;
  bool write_threshold = true;
  int skip_layer = -1;         // leave out this layer's fc2
  int64_t fc1_dim = 64;        // fc1 ne[0]
  int64_t fc2_rank_delta = 0;  // added to fc2 ne[0] of layer 0
  int64_t extra_layers = 0;    // predictors for layers the model does not have

  std::string Write() {
    GgufWriter w;
    w.set_powerinfer_magic(true);
    w.SetValue("general.architecture", GgufString("llama"));
    w.SetValue("llama.block_count", GgufU32(static_cast<uint32_t>(config.n_layers)));
    if (write_threshold) w.SetValue("powerinfer.sparse_threshold", GgufF32(threshold));
    auto add = [&](const std::string& name, const std::vector<float>& v, std::vector<int64_t> ne) {
      std::vector<uint16_t> half(ne[0] * ne[1], 0);
      for (size_t i = 0; i < half.size() && i < v.size(); ++i) half[i] = Fp32ToFp16(v[i]);
      ASSERT_TRUE(w.AddTensorBytes(name, GgmlType::kF16, ne,
                                   std::string_view(reinterpret_cast<const char*>(half.data()),
                                                    half.size() * 2))
                      .ok());
    };
    for (int64_t l = 0; l < config.n_layers + extra_layers; ++l) {
      const PredictorWeights& p = weights[l % config.n_layers];
      add(absl::StrCat("blk.", l, ".fc1.weight"), p.fc1, {fc1_dim, p.rank});
      if (l == skip_layer) continue;
      add(absl::StrCat("blk.", l, ".fc2.weight"), p.fc2,
          {p.rank + (l == 0 ? fc2_rank_delta : 0), config.ffn_dim});
    }
    const std::string path = testing::TempDir() + "/powerinfer.gguf";
    EXPECT_TRUE(w.WriteFile(path).ok());
    return path;
  }
};

TEST(PredictorSetTest, LoadsPowerInferFile) {
  PowerInferFile pf;
  const std::string path = pf.Write();
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->is_powerinfer());
  auto set = PredictorSet::Load(path, pf.config);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_FLOAT_EQ(set->threshold(), 0.25f);
  EXPECT_FLOAT_EQ(set->layer_threshold(1), 0.25f);
  EXPECT_EQ(set->layer(0).rank, 32);
  EXPECT_EQ(set->layer(1).rank, 16);
  EXPECT_EQ(set->layer(0).fc1.type, GgmlType::kF16);
  EXPECT_TRUE(set->report().layers.empty());
  EXPECT_EQ(set->bytes(), (32 + 16) * (64 + 96) * 2);
  ThreadPool pool(2);
  ExpectMatchesReference(*set, RoundedWeights(pf.weights, GgmlType::kF16), pf.config, pool);

  pf.write_threshold = false;
  auto defaulted = PredictorSet::Load(pf.Write(), pf.config);
  ASSERT_TRUE(defaulted.ok()) << defaulted.status();
  EXPECT_EQ(defaulted->threshold(), 0.0f);
}

TEST(PredictorSetTest, BadFilesGiveClearErrors) {
  {
    PowerInferFile pf;
    pf.skip_layer = 1;
    ExpectError(PredictorSet::Load(pf.Write(), pf.config).status(),
                "layer 1 has no predictor: tensor 'blk.1.fc2.weight' is missing");
  }
  {
    PowerInferFile pf;
    pf.fc1_dim = 32;
    ExpectError(PredictorSet::Load(pf.Write(), pf.config).status(),
                "tensor 'blk.0.fc1.weight' has shape (32, 32), expected (64, rank)");
  }
  {
    PowerInferFile pf;
    pf.fc2_rank_delta = 1;
    ExpectError(PredictorSet::Load(pf.Write(), pf.config).status(),
                "tensor 'blk.0.fc2.weight' has shape (33, 96), expected (32, 96)");
  }
  {
    PowerInferFile pf;
    pf.extra_layers = 1;
    ExpectError(PredictorSet::Load(pf.Write(), pf.config).status(),
                "has a predictor for layer 2 but the model has only 2 layers");
  }
  {
    PowerInferFile pf;
    ModelConfig other = pf.config;
    other.ffn_dim = 128;
    ExpectError(PredictorSet::Load(pf.Write(), other).status(),
                "expected (32, 128) to match 'blk.0.fc1.weight'");
  }
  ExpectError(PredictorSet::Load(testing::TempDir() + "/missing.gguf", SmallConfig()).status(),
              "missing.gguf");
}

TEST(PredictorSetTest, WriteReadRoundTrip) {
  const ModelConfig c = SmallConfig();
  const auto weights = RandomWeights(c, {16, 32}, 6);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16}) {
    auto set = PredictorSet::FromWeights(weights, c, type, -0.5f);
    ASSERT_TRUE(set.ok());
    ASSERT_TRUE(set->set_layer_thresholds({-0.5f, 0.125f}).ok());
    PredictorReport report;
    report.training_tokens = 1234;
    report.recall_target = 0.95f;
    report.criterion = "relu";
    report.layers = {{0.96f, 0.5f, 0.2f, 0.1f}, {0.97f, 0.6f, 0.15f, 0.09f}};
    set->set_report(report);
    const std::string path = testing::TempDir() + "/pred.gguf";
    ASSERT_TRUE(WritePredictors(*set, c, path).ok());

    auto back = PredictorSet::Load(path, c);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_FLOAT_EQ(back->threshold(), -0.5f);
    EXPECT_EQ(back->layer_thresholds(), std::vector<float>({-0.5f, 0.125f}));
    for (int64_t l = 0; l < 2; ++l) {
      const LayerPredictor& a = set->layer(l);
      const LayerPredictor& b = back->layer(l);
      EXPECT_EQ(b.rank, a.rank);
      EXPECT_EQ(b.fc1.type, type);
      EXPECT_EQ(std::memcmp(a.fc1.data, b.fc1.data, a.fc1.rows * a.fc1.row_bytes), 0);
      EXPECT_EQ(std::memcmp(a.fc2.data, b.fc2.data, a.fc2.rows * a.fc2.row_bytes), 0);
    }
    EXPECT_EQ(back->report().training_tokens, 1234);
    EXPECT_FLOAT_EQ(back->report().recall_target, 0.95f);
    EXPECT_EQ(back->report().criterion, "relu");
    ASSERT_EQ(back->report().layers.size(), 2u);
    EXPECT_FLOAT_EQ(back->report().layers[1].recall, 0.97f);
    EXPECT_FLOAT_EQ(back->report().layers[1].precision, 0.6f);
    EXPECT_FLOAT_EQ(back->report().layers[1].predicted_active, 0.15f);
    EXPECT_FLOAT_EQ(back->report().layers[1].true_active, 0.09f);
    ThreadPool pool(1);
    ExpectMatchesReference(*back, RoundedWeights(weights, type), c, pool);

    // The file names the model it was trained for.
    ModelConfig other = c;
    other.n_layers = 3;
    ExpectError(PredictorSet::Load(path, other).status(),
                "thermocline.predictor.block_count = 2 but the model has 3");
  }
}

// --- trainer pieces -------------------------------------------------------------------------

TEST(PredictorTrainerTest, SplitsAreExactAndSeeded) {
  for (float holdout : {0.1f, 0.2f, 0.5f}) {
    int64_t counts[3] = {0, 0, 0};
    const int64_t groups = 50;
    const int64_t per_group = std::max<int64_t>(2, std::llround(2.0 / holdout));
    const int64_t n = groups * per_group * kSplitBlockTokens;
    for (int64_t i = 0; i < n; ++i) ++counts[static_cast<int>(SplitOfSample(i, holdout, 9))];
    EXPECT_EQ(counts[1], groups * kSplitBlockTokens) << holdout;
    EXPECT_EQ(counts[2], groups * kSplitBlockTokens) << holdout;
    // Whole blocks go to one side.
    for (int64_t i = 0; i < n; i += kSplitBlockTokens) {
      for (int64_t j = 1; j < kSplitBlockTokens; ++j) {
        ASSERT_EQ(SplitOfSample(i, holdout, 9), SplitOfSample(i + j, holdout, 9));
      }
    }
  }
  int differ = 0;
  for (int64_t i = 0; i < 100000; i += kSplitBlockTokens) {
    differ += SplitOfSample(i, 0.1f, 1) != SplitOfSample(i, 0.1f, 2);
  }
  EXPECT_GT(differ, 0);
}

TEST(PredictorTrainerTest, OptionsAreValidated) {
  const ModelConfig c = SmallConfig();
  PredictorTrainerOptions o;
  o.window = 128;
  EXPECT_TRUE(ValidatePredictorTrainerOptions(o, c).ok());
  auto with = [&](auto mutate) {
    PredictorTrainerOptions x = o;
    mutate(x);
    return ValidatePredictorTrainerOptions(x, c);
  };
  ExpectError(with([](auto& x) { x.window = 1000; }), "--window 1000 must be in [2, 256]");
  ExpectError(with([](auto& x) { x.holdout = 0.9f; }), "--holdout");
  ExpectError(with([](auto& x) { x.recall_target = 1.0f; }), "--recall-target");
  ExpectError(with([](auto& x) { x.epochs = 0; }), "--epochs");
  ExpectError(with([](auto& x) { x.learning_rate = -1; }), "--lr");
  ExpectError(with([](auto& x) {
                x.type = GgmlType::kQ8_0;
                x.rank = 48;
              }),
              "rank 48 must be in [1, 65536] and a multiple of 32");
  ExpectError(with([](auto& x) { x.magnitude_cuts = {0.1f, 0.1f}; }), "ReLU-gated");
  ModelConfig silu = c;
  silu.activation = FfnActivation::kSilu;
  ExpectError(ValidatePredictorTrainerOptions(o, silu), "needs one activation cut per layer");
  EXPECT_EQ(DefaultRankCandidates(SmallConfig(4096, 11008, 1), GgmlType::kF16),
            std::vector<int64_t>({256, 512, 1024, 2048, 3072, 4096}));
  EXPECT_EQ(DefaultRankCandidates(SmallConfig(128, 512, 1), GgmlType::kF16),
            std::vector<int64_t>({16, 32, 64, 96, 128}));
  EXPECT_EQ(DefaultRankCandidates(SmallConfig(64, 172, 1), GgmlType::kF16),
            std::vector<int64_t>({16, 32, 48, 64}));
}

// Samples whose truth is a rank-8 ReLU MLP with a margin: a trainer that works recovers it.
LayerSamples LearnableSamples(const ModelConfig& c, int64_t n, float holdout, uint64_t seed) {
  std::mt19937 rng(11);
  const int64_t true_rank = 8;
  const std::vector<float> g1 = RandomVector(rng, true_rank * c.dim, 1.0f);
  const std::vector<float> g2 = RandomVector(rng, c.ffn_dim * true_rank, 1.0f);
  LayerSamples s(c.dim, c.ffn_dim);
  std::vector<uint64_t> mask(s.words());
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> h = RandomVector(rng, c.dim, 1.0f);
    const std::vector<double> score = ReferenceScores(g1, g2, true_rank, c, h.data());
    std::fill(mask.begin(), mask.end(), 0);
    for (int64_t i = 0; i < c.ffn_dim; ++i) {
      // Sparse: only clearly positive scores are active (about 15%).
      if (score[i] > 8.0) mask[i >> 6] |= uint64_t{1} << (i & 63);
    }
    s.Add(h.data(), mask.data(), SplitOfSample(t, holdout, seed));
  }
  return s;
}

TEST(PredictorTrainerTest, LearnsALearnableLayerDeterministically) {
  const ModelConfig c = SmallConfig(32, 64, 1);
  PredictorTrainerOptions o;
  o.holdout = 0.2f;
  o.rank = 16;
  o.epochs = 30;
  o.batch = 128;
  o.learning_rate = 3e-3f;
  o.type = GgmlType::kF32;
  const LayerSamples s = LearnableSamples(c, 6000, o.holdout, o.seed);
  EXPECT_EQ(s.bytes(), 6000 * (32 * 2 + 8 + 1));
  PredictorWeights first;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    int64_t steps = 0;
    auto r = TrainLayerPredictor(s, o, 0, pool, [&](int64_t n) { steps += n; });
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(steps, MaxTrainingSteps(s, o, 1));
    ASSERT_EQ(r->trials.size(), 1u);
    EXPECT_EQ(r->weights.rank, 16);
    if (threads == 1) {
      first = r->weights;
    } else {
      // The thread count changes how work is split, never the result.
      EXPECT_EQ(r->weights.fc1, first.fc1);
      EXPECT_EQ(r->weights.fc2, first.fc2);
    }
    auto set = PredictorSet::FromWeights({r->weights}, c, GgmlType::kF32, r->threshold);
    ASSERT_TRUE(set.ok());
    const PredictorLayerReport cal =
        EvaluatePredictorLayer(*set, 0, s, SampleSplit::kCalibration, pool);
    const PredictorLayerReport test = EvaluatePredictorLayer(*set, 0, s, SampleSplit::kTest, pool);
    EXPECT_GE(cal.recall, o.recall_target);  // by construction of the threshold
    EXPECT_GE(test.recall, 0.93f);           // unseen tokens
    EXPECT_GT(test.true_active, 0.05f);
    EXPECT_LT(test.true_active, 0.3f);
    // Far better than running everything (precision = true_active) or chance.
    EXPECT_GT(test.precision, 2 * test.true_active);
    EXPECT_NEAR(test.predicted_active, test.true_active * test.recall / test.precision, 1e-4);
    EXPECT_NEAR(cal.precision, r->trials[0].calibration_precision, 0.02);
  }
}

TEST(PredictorTrainerTest, AutoRankStopsWhenALargerRankAddsTooLittle) {
  const ModelConfig c = SmallConfig(32, 64, 1);
  PredictorTrainerOptions o;
  o.holdout = 0.2f;
  o.rank_candidates = {4, 16, 32};
  o.rank_tolerance = 1.0f;  // nothing is worth a larger rank
  o.epochs = 2;
  o.type = GgmlType::kF32;
  const LayerSamples s = LearnableSamples(c, 2000, o.holdout, o.seed);
  ThreadPool pool(1);
  int64_t steps = 0;
  auto r = TrainLayerPredictor(s, o, 0, pool, [&](int64_t n) { steps += n; });
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->trials.size(), 2u);  // 4, then 16 which did not beat it by 1.0
  EXPECT_EQ(r->weights.rank, 4);
  EXPECT_FLOAT_EQ(r->threshold, r->trials[0].threshold);
  EXPECT_EQ(steps, MaxTrainingSteps(s, o, 3));  // skipped candidates still complete the bar
}

}  // namespace
}  // namespace thermocline
