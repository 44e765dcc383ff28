// Accuracy of the sparsity modes on real and synthetic models, end to end:
//   exact on a ReLU-gated synthetic model gives dense's logits (max-abs 1e-5) at 1 and 2 threads,
//     for F32 and F16, through prompt processing (batched gate) and decode (one token);
//   threshold with cuts from `thermocline profile` follows stories260K's measured curve;
//   the `perplexity` and `generate` commands run the modes (PowerInfer files included, with
//     their own predictors and ffn_down_t) and refuse incomplete flags clearly.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/forward.h"
#include "shared/sparsity/predictor.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::BinDir;
using testing::ModelPath;
using testing::RunCommand;

std::string Thermocline() { return BinDir() + "/thermocline"; }

// The value of the "perplexity: X" line of `thermocline perplexity`'s output (0 if missing).
double PerplexityOf(const std::string& out) {
  const size_t p = out.find("perplexity: ");
  return p == std::string::npos ? 0.0 : std::strtod(out.c_str() + p + 12, nullptr);
}
std::string Stories() { return ModelPath("stories260K/stories260K.gguf"); }
std::string Corpus() { return testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt"; }

// A ReLU-gated synthetic model written by the real command, once per type.
std::string ReluModel(const std::string& type) {
  const std::string path = testing::TempDir() + "/relu-" + type + ".gguf";
  auto r = RunCommand({Thermocline(), "synth", "-o", path, "--ffn-kind", "relu-gated", "--type",
                       type, "--seed", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

// Logits of a 24-token prompt (one multi-position call) and 8 greedy decode steps.
std::vector<float> RunLogits(const Model& model, ThreadPool& pool, FfnExecutor* ffn) {
  auto kv = KvCache::Create(model.config(), 1, 32, GgmlType::kF32);
  EXPECT_TRUE(kv.ok()) << kv.status();
  ForwardPass pass(model, *kv, pool, ffn);
  std::vector<BatchEntry> batch;
  for (int32_t p = 0; p < 24; ++p) batch.push_back({0, p, 3 + (p * 37) % 250, true});
  std::vector<float> logits, all;
  EXPECT_TRUE(pass.Run(batch, logits).ok());
  all = logits;
  const int64_t vocab = model.config().vocab_size;
  for (int32_t p = 24; p < 32; ++p) {
    const float* last = all.data() + all.size() - vocab;
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    BatchEntry e{0, p, next, true};
    EXPECT_TRUE(pass.Run(std::span<const BatchEntry>(&e, 1), logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

TEST(ExactSparsityTest, LogitsEqualDenseOnReluModel) {
  for (const std::string type : {"f32", "f16"}) {
    auto model = Model::Load(ReluModel(type));
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ((*model)->config().activation, FfnActivation::kRelu);
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      const std::vector<float> dense = RunLogits(**model, pool, nullptr);
      auto sparse = SparseFfn::Create(
          **model, SparsityPlan::Uniform(SparsityMode::kExact, (*model)->config().n_layers), pool);
      ASSERT_TRUE(sparse.ok()) << sparse.status();
      const std::vector<float> exact = RunLogits(**model, pool, sparse->get());
      ASSERT_EQ(dense.size(), exact.size());
      float diff = 0, scale = 0;
      for (size_t i = 0; i < dense.size(); ++i) {
        diff = std::max(diff, std::fabs(dense[i] - exact[i]));
        scale = std::max(scale, std::fabs(dense[i]));
      }
      // Why this close: every gate and up value comes from the same kernel with the same
      // operation order as dense (GatherMatMul vs MatMul), and act(g) * u uses the same float
      // operations, so each neuron's coefficient is bit-identical; the skipped neurons add
      // exactly 0 in dense. Only the order in which down sums the coefficients differs (axpy
      // over rows of down_t vs dot products over rows of down), a few f32 roundings per layer.
      std::printf("%s threads=%d: max |exact - dense| = %.3g (max |logit| %.3g), active %.3f\n",
                  type.c_str(), threads, diff, scale, (*sparse)->ActiveRatio());
      EXPECT_LE(diff, 1e-5f) << type << " threads=" << threads;
      EXPECT_GT((*sparse)->ActiveRatio(), 0.0);
      EXPECT_LT((*sparse)->ActiveRatio(), 0.9);
    }
  }
}

// stories260K with cuts from the real `thermocline profile` (first 4k corpus tokens), perplexity
// on the first 15k tokens. Threshold mode skips a neuron's down row on its coefficient
// |silu(gate) * up| (the target sparsity) and its up row on |silu(gate)| (the default 20% gate
// sparsity). CATS's gate-only criterion costs this tiny model x1.38 at 50%; the coefficient
// criterion x1.035 (docs/sparsity.md has the curves).
class ThresholdSparsityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    stats_ = new std::string(testing::TempDir() + "/stories-stats.gguf");
    auto r =
        RunCommand({Thermocline(), "profile", "--model", Stories(), "--corpus", Corpus(),
                    "--tokens", "4000", "--targets", "0.2,0.3,0.5", "--threads", "2", "-o",
                    *stats_});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete stats_; }

  struct Measured {
    double perplexity = 0;
    double sparsity = 0;     // share of down rows skipped
    double up_sparsity = 0;  // share of up rows skipped
  };
  // Perplexity in `mode` at `target` (threshold), through the same flag path as the commands.
  static Measured Run(const std::string& mode, std::optional<float> target) {
    Measured m;
    auto model = Model::Load(Stories());
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return m;
    auto tokens = TokenizeCorpusFile(Corpus(), (*model)->tokenizer(), 15000);
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    SparsityFlags flags;
    flags.mode = mode;
    if (target) {
      flags.stats_path = *stats_;
      flags.target_sparsity = target;
    }
    auto plan = SparsityPlanFromFlags(**model, flags);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!tokens.ok() || !plan.ok()) return m;
    ThreadPool pool(2);
    std::unique_ptr<SparseFfn> sparse;
    if (!plan->AllDense()) {
      auto made = SparseFfn::Create(**model, *plan, pool);
      EXPECT_TRUE(made.ok()) << made.status();
      if (!made.ok()) return m;
      sparse = std::move(*made);
    }
    auto kv = KvCache::Create((*model)->config(), 1, 256, GgmlType::kF32);
    EXPECT_TRUE(kv.ok());
    ForwardPass pass(**model, *kv, pool, sparse.get());
    CorpusWindowOptions wo;
    wo.window = 256;
    auto r = Perplexity(pass, *tokens, wo);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) m.perplexity = r->perplexity;
    if (sparse) {
      m.sparsity = 1 - sparse->DownRatio();
      m.up_sparsity = 1 - sparse->ActiveRatio();
    }
    return m;
  }

  static std::string* stats_;
};
std::string* ThresholdSparsityTest::stats_ = nullptr;

TEST_F(ThresholdSparsityTest, Stories260KCurveFromProfiledCuts) {
  const Measured dense = Run("dense", std::nullopt);
  const Measured s30 = Run("threshold", 0.3f);
  const Measured s50 = Run("threshold", 0.5f);
  std::printf(
      "stories260K, 15k tokens: dense %.4f; threshold 30%%: %.4f (x%.4f, down/up sparsity "
      "%.3f/%.3f); 50%%: %.4f (x%.4f, %.3f/%.3f)\n",
      dense.perplexity, s30.perplexity, s30.perplexity / dense.perplexity, s30.sparsity,
      s30.up_sparsity, s50.perplexity, s50.perplexity / dense.perplexity, s50.sparsity,
      s50.up_sparsity);
  // The profiled cuts reach their targets on other text to within a few points; the gate cut
  // adds its own few points of down rows (neurons it drops are not in the coefficient count).
  EXPECT_NEAR(s30.sparsity, 0.3, 0.06);
  EXPECT_NEAR(s50.sparsity, 0.5, 0.04);
  EXPECT_NEAR(s30.up_sparsity, 0.2, 0.03);
  EXPECT_NEAR(s50.up_sparsity, 0.2, 0.03);
  EXPECT_LE(s30.perplexity, 1.03 * dense.perplexity);
  EXPECT_GT(s50.perplexity, s30.perplexity);
}

// The acceptance criterion: 50% sparsity within 5% of dense perplexity.
TEST_F(ThresholdSparsityTest, Stories260KAtHalfSparsityWithinFivePercentOfDense) {
  const Measured dense = Run("dense", std::nullopt);
  const Measured s50 = Run("threshold", 0.5f);
  EXPECT_GE(s50.sparsity, 0.48);
  EXPECT_LE(s50.perplexity, 1.05 * dense.perplexity);
}

TEST(PerplexityCommandTest, PrintsPerplexityAndActiveRatios) {
  const std::string model = ReluModel("f32");
  auto dense = RunCommand({Thermocline(), "perplexity", "--model", model, "--corpus", Corpus(),
                           "--tokens", "2000", "--window", "128", "--threads", "2"});
  ASSERT_EQ(dense.exit_code, 0) << dense.err;
  EXPECT_NE(dense.out.find("perplexity: "), std::string::npos) << dense.out;
  EXPECT_EQ(dense.out.find("active ratio"), std::string::npos) << dense.out;
  auto exact =
      RunCommand({Thermocline(), "perplexity", "--model", model, "--corpus", Corpus(), "--tokens",
                  "2000", "--window", "128", "--threads", "2", "--sparsity", "exact"});
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  EXPECT_NE(exact.out.find("active ratio: "), std::string::npos) << exact.out;
  EXPECT_NE(exact.out.find("    3  exact"), std::string::npos) << exact.out;
  // The same perplexity: exact loses nothing (the logits differ in the last f32 bits only).
  EXPECT_NEAR(PerplexityOf(exact.out), PerplexityOf(dense.out), 1e-5 * PerplexityOf(dense.out));
}

TEST(PerplexityCommandTest, ClearErrors) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--sparsity", "threshold"}, "--stats"},
      {{"--sparsity", "predicted"}, "--predictor"},
      {{"--sparsity", "exact"}, "ReLU"},
      {{"--sparsity", "sparse"}, "dense, exact, threshold, predicted"},
      {{"--sparsity", "threshold", "--stats", "/nonexistent.gguf", "--target-sparsity", "0.5"},
       "/nonexistent.gguf"},
      {{"--sparsity", "threshold", "--stats", "/nonexistent.gguf"}, "go together"},
      {{"--sparsity", "dense", "--predictor", "/p.gguf"}, "only used by sparsity mode 'predicted'"},
      {{"--sparsity", "predicted", "--predictor", Stories()}, "--predictor"},
  };
  for (const Case& k : cases) {
    std::vector<std::string> argv = {Thermocline(), "perplexity", "--model",  Stories(),
                                     "--corpus",    Corpus(),     "--tokens", "500"};
    argv.insert(argv.end(), k.flags.begin(), k.flags.end());
    auto r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 1) << k.message << ": " << r.out;
    EXPECT_NE(r.err.find(k.message), std::string::npos) << r.err;
  }
}

// A predictor file that predicts every neuron (threshold far below any score) turns predicted
// mode into exact mode: the same perplexity, and the predicted share shows 1.
TEST(PerplexityCommandTest, PredictedModeReadsAPredictorFile) {
  const std::string model_path = ReluModel("f32");
  auto model = Model::Load(model_path);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  std::vector<PredictorWeights> layers(c.n_layers);
  for (PredictorWeights& p : layers) {
    p.rank = 32;
    p.fc1.assign(p.rank * c.dim, 0.01f);
    p.fc2.assign(c.ffn_dim * p.rank, 0.01f);
  }
  auto set = PredictorSet::FromWeights(layers, c, GgmlType::kF16, -1e30f);
  ASSERT_TRUE(set.ok()) << set.status();
  const std::string pred = testing::TempDir() + "/all.gguf";
  ASSERT_TRUE(WritePredictors(*set, c, pred).ok());
  double ppl[2] = {0, 0};
  const char* modes[2] = {"exact", "predicted"};
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> argv = {
        Thermocline(), "perplexity", "--model", model_path,  "--corpus", Corpus(),     "--tokens",
        "1000",        "--window",   "128",     "--threads", "2",        "--sparsity", modes[i]};
    if (i == 1) argv.insert(argv.end(), {"--predictor", pred});
    auto r = RunCommand(argv);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ppl[i] = PerplexityOf(r.out);
    if (i == 1) {
      EXPECT_NE(r.out.find("predicted"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("1.0000\n"), std::string::npos) << r.out;
    }
  }
  EXPECT_GT(ppl[0], 1.0);
  EXPECT_NEAR(ppl[1], ppl[0], 1e-5 * ppl[0]);
}

// The same weights in PowerInfer's layout (PWRI, ffn_down_t, its own fc1/fc2 predictors) run
// in every mode: dense and exact give the llama.cpp file's perplexity, predicted needs no
// --predictor and stays within the 2% of exact, and the model's predictors also serve
// the llama.cpp file through --predictor.
TEST(PerplexityCommandTest, PowerInferFileRunsInEveryMode) {
  const std::string dir = testing::TempDir();
  auto synth = RunCommand({Thermocline(), "synth", "-o", dir + "/m.gguf", "--ffn-kind",
                           "relu-gated", "--type", "f16", "--seed", "3", "--powerinfer"});
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  const std::string llama = dir + "/m.gguf", pwri = dir + "/m.powerinfer.gguf";
  auto run = [&](const std::string& model, std::vector<std::string> flags) {
    std::vector<std::string> argv = {Thermocline(), "perplexity", "--model",   model,
                                     "--corpus",    Corpus(),     "--tokens",  "1000",
                                     "--window",    "128",        "--threads", "2"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  };
  const double reference = PerplexityOf(run(llama, {}).out);
  ASSERT_GT(reference, 1.0);
  EXPECT_NEAR(PerplexityOf(run(pwri, {}).out), reference, 1e-5 * reference);
  auto exact = run(pwri, {"--sparsity", "exact"});
  EXPECT_NEAR(PerplexityOf(exact.out), reference, 1e-5 * reference);
  // ffn_down_t is used as stored: no transposed copy.
  EXPECT_EQ(exact.err.find("transposed down rows"), std::string::npos) << exact.err;
  auto own = run(pwri, {"--sparsity", "predicted"});
  EXPECT_NEAR(PerplexityOf(own.out), reference, 0.02 * reference) << own.out;
  EXPECT_NE(own.out.find("predicted"), std::string::npos) << own.out;
  auto borrowed = run(llama, {"--sparsity", "predicted", "--predictor", pwri});
  EXPECT_NEAR(PerplexityOf(borrowed.out), PerplexityOf(own.out), 1e-5 * reference);
}

TEST(GenerateCommandTest, ExactSparsityGeneratesTheDenseText) {
  const std::string model = ReluModel("f16");
  std::string outs[2];
  const char* modes[2] = {"dense", "exact"};
  for (int i = 0; i < 2; ++i) {
    auto r = RunCommand({Thermocline(), "generate", "--model", model, "--prompt",
                         "Once upon a time", "--max-new-tokens", "24", "--temperature", "0",
                         "--threads", "2", "--ignore-eos", "--sparsity", modes[i]});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    outs[i] = r.out;
    if (i == 1) {
      EXPECT_NE(r.err.find("active"), std::string::npos) << r.err;
    }
  }
  EXPECT_EQ(outs[0], outs[1]);
  auto bad = RunCommand({Thermocline(), "generate", "--model", Stories(), "--prompt", "x",
                         "--sparsity", "threshold"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--stats"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace thermocline
