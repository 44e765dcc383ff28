// PowerInfer's GGUF variant, written by `thermocline synth --powerinfer` beside the llama.cpp
// layout of the same weights:
//   the file has the PWRI magic, ffn_down_t instead of ffn_down, fc1/fc2 predictors and
//   powerinfer.sparse_threshold, and loads as a ReLU model with transposed down rows;
//   every other tensor is byte-identical to the llama.cpp file, and down_t is down transposed
//   bit for bit (F32, F16);
//   the dense pass gives the llama.cpp file's logits up to the order of the down sums;
//   every sparsity mode runs on it: exact == dense (1e-5), threshold with profiled cuts, and
//   predicted with the file's own predictors (recall, perplexity within 2% of exact), and the
//   llama.cpp file running the PowerInfer file's predictors picks the same neurons.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/gguf/quant.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/forward.h"
#include "shared/sparsity/predictor.h"
#include "shared/sparsity/profiler.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::BinDir;
using testing::RunCommand;

std::string Corpus() { return testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt"; }

constexpr int64_t kLayers = 4;

struct ModelPair {
  std::string llama, powerinfer;
};

// Both layouts of one realistic ReLU model, written by the real command.
ModelPair WritePair(const std::string& type) {
  const std::string dir = testing::TempDir();
  ModelPair p{dir + "/m-" + type + ".gguf", dir + "/m-" + type + ".powerinfer.gguf"};
  const testing::CommandResult r = RunCommand({BinDir() + "/thermocline",
                                               "synth",
                                               "-o",
                                               p.llama,
                                               "--powerinfer",
                                               "--ffn-kind",
                                               "relu-gated",
                                               "--type",
                                               type,
                                               "--dim",
                                               "256",
                                               "--ffn",
                                               "1024",
                                               "--layers",
                                               std::to_string(kLayers),
                                               "--heads",
                                               "8",
                                               "--kv-heads",
                                               "4",
                                               "--vocab",
                                               "512",
                                               "--context",
                                               "256",
                                               "--seed",
                                               "11"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("wrote " + p.powerinfer), std::string::npos) << r.err;
  return p;
}

std::vector<float> Rows(const GgufTensorInfo& t) {
  const int64_t ne0 = t.ne[0], rows = t.n_elements / ne0;
  std::vector<float> out(static_cast<size_t>(t.n_elements));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(t.type, t.data + r * RowBytes(t.type, ne0), out.data() + r * ne0, ne0);
  }
  return out;
}

std::vector<int32_t> CorpusTokens(const Model& model, int64_t n) {
  auto tokens = TokenizeCorpusFile(Corpus(), model.tokenizer(), n);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<int32_t>{};
}

// Logits of a 48-token corpus prompt (one multi-position call: the batched paths) and 8 greedy
// decode steps (one token per call: the single-token paths).
std::vector<float> RunLogits(const Model& model, ThreadPool& pool, FfnExecutor* ffn) {
  auto kv = KvCache::Create(model.config(), 1, 64, GgmlType::kF32);
  EXPECT_TRUE(kv.ok()) << kv.status();
  ForwardPass pass(model, *kv, pool, ffn);
  const std::vector<int32_t> tokens = CorpusTokens(model, 47);
  std::vector<BatchEntry> batch = {{0, 0, 1, true}};  // BOS
  for (size_t p = 0; p < tokens.size(); ++p) {
    batch.push_back({0, static_cast<int32_t>(p + 1), tokens[p], true});
  }
  std::vector<float> logits, all;
  EXPECT_TRUE(pass.Run(batch, logits).ok());
  all = logits;
  const int64_t vocab = model.config().vocab_size;
  for (int32_t p = static_cast<int32_t>(batch.size()); p < static_cast<int32_t>(batch.size()) + 8;
       ++p) {
    const float* last = all.data() + all.size() - vocab;
    const auto next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    BatchEntry e{0, p, next, true};
    EXPECT_TRUE(pass.Run(std::span<const BatchEntry>(&e, 1), logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

struct Diff {
  float max_abs = 0;
  float max_logit = 0;
  double rel_rms = 0;  // RMS of the difference over the RMS of the reference
};

Diff Compare(const std::vector<float>& ref, const std::vector<float>& x) {
  Diff d;
  EXPECT_EQ(ref.size(), x.size());
  double se = 0, sr = 0;
  for (size_t i = 0; i < std::min(ref.size(), x.size()); ++i) {
    d.max_abs = std::max(d.max_abs, std::fabs(ref[i] - x[i]));
    d.max_logit = std::max(d.max_logit, std::fabs(ref[i]));
    se += double(ref[i] - x[i]) * (ref[i] - x[i]);
    sr += double(ref[i]) * ref[i];
  }
  d.rel_rms = std::sqrt(se / sr);
  return d;
}

TEST(PowerInferFormatTest, LayoutKeysAndTensors) {
  for (const std::string type : {"f32", "f16"}) {
    SCOPED_TRACE(type);
    const ModelPair p = WritePair(type);
    auto llama = GgufFile::Open(p.llama);
    auto pi = GgufFile::Open(p.powerinfer);
    ASSERT_TRUE(llama.ok()) << llama.status();
    ASSERT_TRUE(pi.ok()) << pi.status();
    EXPECT_FALSE((*llama)->is_powerinfer());
    EXPECT_TRUE((*pi)->is_powerinfer());
    EXPECT_EQ(testing::ReadFileOrDie(p.powerinfer).substr(0, 4), "PWRI");
    EXPECT_EQ((*pi)->GetDouble("powerinfer.sparse_threshold").value(), 0.0);
    EXPECT_EQ((*llama)->FindValue("powerinfer.sparse_threshold"), nullptr);
    // Every llama.cpp tensor but ffn_down is in both files with the same bytes; the PowerInfer
    // file adds ffn_down_t, fc1 and fc2 per layer.
    EXPECT_EQ((*pi)->tensors().size(), (*llama)->tensors().size() + 2 * kLayers);
    for (const GgufTensorInfo& t : (*llama)->tensors()) {
      if (t.name.find("ffn_down") != std::string::npos) {
        EXPECT_EQ((*pi)->FindTensor(t.name), nullptr) << t.name;
        continue;
      }
      const GgufTensorInfo* u = (*pi)->FindTensor(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_EQ(u->type, t.type) << t.name;
      EXPECT_EQ(u->ne, t.ne) << t.name;
      ASSERT_EQ(u->n_bytes, t.n_bytes) << t.name;
      EXPECT_EQ(std::memcmp(u->data, t.data, t.n_bytes), 0) << t.name;
    }
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const GgufTensorInfo* down = (*llama)->FindTensor(b + "ffn_down.weight");
      const GgufTensorInfo* down_t = (*pi)->FindTensor(b + "ffn_down_t.weight");
      ASSERT_NE(down, nullptr);
      ASSERT_NE(down_t, nullptr);
      EXPECT_EQ(down->ne, (std::vector<int64_t>{1024, 256}));
      EXPECT_EQ(down_t->ne, (std::vector<int64_t>{256, 1024}));
      EXPECT_EQ(down_t->type, down->type);
      // Transposed bit for bit: float types round each element on its own.
      const std::vector<float> d = Rows(*down), dt = Rows(*down_t);
      for (int64_t i = 0; i < 1024; ++i) {
        for (int64_t j = 0; j < 256; ++j) {
          ASSERT_EQ(dt[i * 256 + j], d[j * 1024 + i]) << b << " neuron " << i << " dim " << j;
        }
      }
      const GgufTensorInfo* fc1 = (*pi)->FindTensor(b + "fc1.weight");
      const GgufTensorInfo* fc2 = (*pi)->FindTensor(b + "fc2.weight");
      ASSERT_NE(fc1, nullptr);
      ASSERT_NE(fc2, nullptr);
      ASSERT_EQ(fc1->ne.size(), 2u);
      EXPECT_EQ(fc1->ne[0], 256);
      EXPECT_EQ(fc2->ne, (std::vector<int64_t>{fc1->ne[1], 1024}));
      EXPECT_EQ(fc1->type, GgmlType::kF16);
      EXPECT_EQ(fc2->type, GgmlType::kF16);
    }

    auto model = Model::Load(p.powerinfer);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE((*model)->file().is_powerinfer());
    EXPECT_EQ((*model)->config().activation, FfnActivation::kRelu);
    for (int64_t l = 0; l < kLayers; ++l) {
      EXPECT_TRUE((*model)->layer(l).has_down_t) << l;
      EXPECT_EQ((*model)->layer(l).down.data, nullptr) << l;
    }
    auto set = PredictorSet::Load(p.powerinfer, (*model)->config());
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_EQ(set->n_layers(), kLayers);
    EXPECT_EQ(set->threshold(), 0.0f);
  }
}

// The two layouts compute the same products; only the order of the down sums differs (dot
// products over ffn_down rows in MatMul against axpy over ffn_down_t rows), so the logits agree
// to a few f32 roundings of each FFN output, carried through the later layers: bound 1e-5 of the
// largest logit (f32 rounding is 6e-8; a 1024-term sum in another order moves each output by
// a few roundings of its largest terms).
TEST(PowerInferFormatTest, DenseLogitsMatchTheLlamaLayout) {
  for (const std::string type : {"f32", "f16"}) {
    const ModelPair p = WritePair(type);
    auto llama = Model::Load(p.llama);
    auto pi = Model::Load(p.powerinfer);
    ASSERT_TRUE(llama.ok()) << llama.status();
    ASSERT_TRUE(pi.ok()) << pi.status();
    ThreadPool pool(2);
    const Diff d = Compare(RunLogits(**llama, pool, nullptr), RunLogits(**pi, pool, nullptr));
    std::printf("%s: max |powerinfer - llama.cpp| = %.3g (max |logit| %.3g, relative rms %.3g)\n",
                type.c_str(), d.max_abs, d.max_logit, d.rel_rms);
    // Measured: 1.7e-6 (f32) and 1.4e-6 (f16) with logits up to ~4.
    EXPECT_LE(d.max_abs, 1e-5f * std::max(1.0f, d.max_logit)) << type;
  }
}

class PowerInferModesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pair_ = new ModelPair(WritePair("f32")); }
  static void TearDownTestSuite() { delete pair_; }
  static ModelPair* pair_;
};
ModelPair* PowerInferModesTest::pair_ = nullptr;

TEST_F(PowerInferModesTest, EveryModeRuns) {
  auto model = Model::Load(pair_->powerinfer);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  // Threshold: coefficient cuts from the profiler at 95% sparsity drop the down rows of the
  // weakest half of the neurons that fire (whose up rows still run: a ReLU zero skips both).
  ProfileOptions po;
  po.targets = {0.95f};
  po.frequency_target = 0.95f;
  ThreadPool profile_pool(2);
  auto profile = ProfileActivations(**model, CorpusTokens(**model, 3000), po, profile_pool);
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto tplan = SparsityPlan::ForModel(c, SparsityMode::kThreshold, &profile->stats, 0.95f, nullptr);
  ASSERT_TRUE(tplan.ok()) << tplan.status();
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    const std::vector<float> dense = RunLogits(**model, pool, nullptr);

    auto exact =
        SparseFfn::Create(**model, SparsityPlan::Uniform(SparsityMode::kExact, c.n_layers), pool);
    ASSERT_TRUE(exact.ok()) << exact.status();
    EXPECT_EQ((*exact)->down_t_bytes(), 0);  // the file's own ffn_down_t rows, no copy
    const Diff de = Compare(dense, RunLogits(**model, pool, exact->get()));
    const double exact_active = (*exact)->ActiveRatio();
    std::printf("threads %d: exact: max |exact - dense| %.3g, active %.4f\n", threads, de.max_abs,
                exact_active);
    EXPECT_LE(de.max_abs, 1e-5f);
    EXPECT_GT(exact_active, 0.05);
    EXPECT_LT(exact_active, 0.15);

    auto threshold = SparseFfn::Create(**model, *tplan, pool);
    ASSERT_TRUE(threshold.ok()) << threshold.status();
    const Diff dt = Compare(dense, RunLogits(**model, pool, threshold->get()));
    const double threshold_active = (*threshold)->DownRatio();
    std::printf("threads %d: threshold 0.95: relative rms error %.4f, down rows %.4f\n", threads,
                dt.rel_rms, threshold_active);
    // Up rows: those of the neurons that fire (later layers see slightly different inputs).
    EXPECT_NEAR((*threshold)->ActiveRatio(), exact_active, 0.01);
    EXPECT_LT(threshold_active, exact_active);
    EXPECT_GT(threshold_active, 0.02);
    EXPECT_LT(dt.rel_rms, 0.2);

    // Predicted, with the predictors the file carries (no --predictor).
    auto pplan = SparsityPlanFromFlags(**model, SparsityFlags{.mode = "predicted"});
    ASSERT_TRUE(pplan.ok()) << pplan.status();
    auto predicted = SparseFfn::Create(**model, *pplan, pool);
    ASSERT_TRUE(predicted.ok()) << predicted.status();
    const Diff dp = Compare(dense, RunLogits(**model, pool, predicted->get()));
    int64_t candidates = 0, tokens = 0;
    for (const LayerActivity& a : (*predicted)->activity()) {
      candidates += a.candidates;
      tokens += a.tokens;
    }
    const double predicted_active = (*predicted)->ActiveRatio();
    const double candidate_ratio = double(candidates) / (double(tokens) * c.ffn_dim);
    std::printf(
        "threads %d: predicted: relative rms error %.4f, candidates %.4f, active %.4f (%.4f of "
        "exact's)\n",
        threads, dp.rel_rms, candidate_ratio, predicted_active, predicted_active / exact_active);
    // The neurons that run are the predicted ones that fire: about recall x exact's.
    EXPECT_GE(predicted_active, 0.95 * exact_active);
    EXPECT_LE(predicted_active, exact_active + 1e-9);
    EXPECT_LT(candidate_ratio, 0.3);
    EXPECT_LT(dp.rel_rms, 0.1);
  }
}

// The analytic predictors lose little: perplexity over the corpus within 2% of exact's (the
// issue's bound for predictors).
TEST_F(PowerInferModesTest, PredictedPerplexityWithinTwoPercentOfExact) {
  auto model = Model::Load(pair_->powerinfer);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = CorpusTokens(**model, 2000);
  CorpusWindowOptions wo;
  wo.window = 256;
  auto ppl = [&](const SparsityPlan& plan) -> double {
    auto ffn = SparseFfn::Create(**model, plan, pool);
    EXPECT_TRUE(ffn.ok()) << ffn.status();
    auto kv = KvCache::Create(c, 1, wo.window, GgmlType::kF32);
    EXPECT_TRUE(kv.ok()) << kv.status();
    ForwardPass pass(**model, *kv, pool, ffn->get());
    auto r = Perplexity(pass, tokens, wo);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->perplexity : 0;
  };
  const double exact = ppl(SparsityPlan::Uniform(SparsityMode::kExact, c.n_layers));
  auto pplan = SparsityPlanFromFlags(**model, SparsityFlags{.mode = "predicted"});
  ASSERT_TRUE(pplan.ok()) << pplan.status();
  const double predicted = ppl(*pplan);
  std::printf("perplexity: exact %.4f, predicted %.4f (x%.4f)\n", exact, predicted,
              predicted / exact);
  EXPECT_LE(std::fabs(predicted / exact - 1), 0.02);
}

// Both engines, identical weights: the llama.cpp file running the PowerInfer file's predictors
// picks the same neurons, so its predicted logits match the PowerInfer file's as closely as the
// dense ones do.
TEST_F(PowerInferModesTest, LlamaLayoutRunsThePowerInferPredictors) {
  auto llama = Model::Load(pair_->llama);
  auto pi = Model::Load(pair_->powerinfer);
  ASSERT_TRUE(llama.ok()) << llama.status();
  ASSERT_TRUE(pi.ok()) << pi.status();
  ThreadPool pool(2);
  auto lplan = SparsityPlanFromFlags(
      **llama, SparsityFlags{.mode = "predicted", .predictor_path = pair_->powerinfer});
  ASSERT_TRUE(lplan.ok()) << lplan.status();
  auto pplan = SparsityPlanFromFlags(**pi, SparsityFlags{.mode = "predicted"});
  ASSERT_TRUE(pplan.ok()) << pplan.status();
  auto lffn = SparseFfn::Create(**llama, *lplan, pool);
  auto pffn = SparseFfn::Create(**pi, *pplan, pool);
  ASSERT_TRUE(lffn.ok()) << lffn.status();
  ASSERT_TRUE(pffn.ok()) << pffn.status();
  const Diff d = Compare(RunLogits(**pi, pool, pffn->get()), RunLogits(**llama, pool, lffn->get()));
  std::printf("predicted: max |llama.cpp layout - powerinfer| = %.3g (max |logit| %.3g)\n",
              d.max_abs, d.max_logit);
  EXPECT_LE(d.max_abs, 1e-4f * std::max(1.0f, d.max_logit));
  EXPECT_NEAR((*lffn)->ActiveRatio(), (*pffn)->ActiveRatio(), 1e-3);
}

// The command line runs it too: perplexity in predicted mode on the PowerInfer file alone.
TEST_F(PowerInferModesTest, PerplexityCommandRunsPredicted) {
  const testing::CommandResult r =
      RunCommand({BinDir() + "/thermocline", "perplexity", "--model", pair_->powerinfer, "--corpus",
                  Corpus(), "--tokens", "600", "--sparsity", "predicted", "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::printf("%s", r.out.c_str());
  EXPECT_NE(r.out.find("perplexity"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace thermocline
