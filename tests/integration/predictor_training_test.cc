// `thermocline train-predictor` end to end on a synthetic ReLU-gated model: the written file
// loads, its held-out recall reaches the target at the stored threshold, and an independent
// re-measurement with the loaded weights on the same held-out tokens agrees with the report.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/runtime/corpus.h"
#include "shared/sparsity/predictor.h"
#include "shared/sparsity/predictor_trainer.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::BinDir;
using testing::RunCommand;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class PredictorTrainingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempDir());
    model_ = new std::string(*dir_ + "/relu.gguf");
    const testing::CommandResult r = RunCommand({BinDir() + "/thermocline",
                                                 "synth",
                                                 "--ffn-kind",
                                                 "relu-gated",
                                                 "--dim",
                                                 "128",
                                                 "--ffn",
                                                 "512",
                                                 "--layers",
                                                 "2",
                                                 "--heads",
                                                 "4",
                                                 "--kv-heads",
                                                 "2",
                                                 "--vocab",
                                                 "512",
                                                 "--context",
                                                 "256",
                                                 "--seed",
                                                 "3",
                                                 "-o",
                                                 *model_});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete model_;
  }
  static std::string Corpus() {
    return testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt";
  }
  // Text the predictors were not trained on.
  static std::string OtherCorpus() {
    return testing::SharedDataDir() + "/corpus/austen_six_novels.txt";
  }

  static std::string* dir_;
  static std::string* model_;
};
std::string* PredictorTrainingTest::dir_ = nullptr;
std::string* PredictorTrainingTest::model_ = nullptr;

TEST_F(PredictorTrainingTest, HeldOutRecallReachesTarget) {
  const std::string out = *dir_ + "/pred.gguf";
  const testing::CommandResult r = RunCommand({BinDir() + "/thermocline",
                                               "train-predictor",
                                               "--model",
                                               *model_,
                                               "--corpus",
                                               Corpus(),
                                               "--tokens",
                                               "8000",
                                               "--window",
                                               "256",
                                               "--holdout",
                                               "0.2",
                                               "--rank",
                                               "auto",
                                               "--rank-candidates",
                                               "32,64",
                                               "--epochs",
                                               "10",
                                               "--threads",
                                               "2",
                                               "--seed",
                                               "5",
                                               "-o",
                                               out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::printf("%s", r.out.c_str());
  EXPECT_TRUE(Contains(r.out, "recall")) << r.out;
  EXPECT_TRUE(Contains(r.out, "wrote " + out)) << r.out;

  auto model = Model::Load(*model_);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto set = PredictorSet::Load(out, c);
  ASSERT_TRUE(set.ok()) << set.status();
  const PredictorReport& report = set->report();
  ASSERT_EQ(report.layers.size(), 2u);
  EXPECT_EQ(report.criterion, "relu");
  EXPECT_FLOAT_EQ(report.recall_target, 0.95f);
  EXPECT_GT(report.training_tokens, 5000);
  for (int64_t l = 0; l < set->n_layers(); ++l) {
    const PredictorLayerReport& lr = report.layers[l];
    EXPECT_GE(lr.recall, 0.95f) << "layer " << l;
    // About 10% of neurons fire. Running all of them has precision 0.1; the predictor must
    // run few more than the active ones.
    EXPECT_NEAR(lr.true_active, 0.1f, 0.03f) << "layer " << l;
    EXPECT_GT(lr.precision, 0.5f) << "layer " << l;
    EXPECT_LT(lr.predicted_active, 0.25f) << "layer " << l;
    EXPECT_EQ(set->layer(l).fc1.type, GgmlType::kF16);
  }

  // Re-measure with the loaded file on the same held-out tokens (same window, holdout, seed).
  auto tokens = TokenizeCorpusFile(Corpus(), (*model)->tokenizer(), 8000);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  PredictorTrainerOptions o;
  o.window = 256;
  o.holdout = 0.2f;
  o.seed = 5;
  ThreadPool pool(2);
  auto samples = CollectPredictorSamples(**model, *tokens, o, pool);
  ASSERT_TRUE(samples.ok()) << samples.status();
  for (int64_t l = 0; l < set->n_layers(); ++l) {
    const PredictorLayerReport m =
        EvaluatePredictorLayer(*set, l, (*samples)[l], SampleSplit::kTest, pool);
    EXPECT_GE(m.recall, 0.95f) << "layer " << l;
    EXPECT_NEAR(m.recall, report.layers[l].recall, 1e-3) << "layer " << l;
    EXPECT_NEAR(m.precision, report.layers[l].precision, 1e-3) << "layer " << l;
    EXPECT_NEAR(m.true_active, report.layers[l].true_active, 1e-6) << "layer " << l;
  }

  // Predicted mode keeps the model's output: perplexity within 2% of exact on other text.
  auto perplexity = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {BinDir() + "/thermocline", "perplexity", "--model", *model_,
                                     "--corpus", OtherCorpus(), "--tokens", "3000", "--threads",
                                     "2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const testing::CommandResult p = RunCommand(argv);
    EXPECT_EQ(p.exit_code, 0) << p.err;
    const std::string text = p.out + p.err;
    double value = -1;
    for (size_t at = text.find("perplexity: "); at != std::string::npos;
         at = text.find("perplexity: ", at + 1)) {
      if (std::sscanf(text.c_str() + at, "perplexity: %lf", &value) == 1) break;
    }
    EXPECT_GT(value, 0) << text;
    return value;
  };
  const double exact = perplexity({"--sparsity", "exact"});
  const double predicted = perplexity({"--sparsity", "predicted", "--predictor", out});
  std::printf("perplexity: exact %.4f, predicted %.4f (%+.3f%%)\n", exact, predicted,
              100 * (predicted / exact - 1));
  EXPECT_LT(std::abs(predicted / exact - 1), 0.02);
}

TEST_F(PredictorTrainingTest, BadArgumentsAreNamed) {
  const std::string bin = BinDir() + "/thermocline";
  const std::string out = *dir_ + "/bad.gguf";
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--rank", "0"}, "--rank '0' is neither a positive integer nor 'auto'"},
      {{"--holdout", "0.9"}, "--holdout must be in (0, 0.5]"},
      {{"--recall-target", "1.5"}, "--recall-target must be in (0, 1)"},
      {{"--type", "q4_0"}, "--type 'q4_0' is not one of"},
      {{"--window", "100000"}, "--window 100000 must be in [2, 256]"},
      {{"--rank", "16", "--rank-candidates", "16,32"}, "--rank-candidates needs --rank auto"},
      {{"--eval-tokens", "100"}, "--eval-tokens needs --eval-corpus"},
      {{"--eval-corpus", *dir_ + "/no-eval.txt"}, "no-eval.txt"},
      {{"--eval-corpus", OtherCorpus(), "--eval-tokens", "300"}, "--eval-corpus " + OtherCorpus() +
                                                                   ": too few tokens"},
  };
  for (const Case& k : cases) {
    std::vector<std::string> argv = {bin,      "train-predictor", "--model", *model_, "--corpus",
                                     Corpus(), "--tokens",        "600",     "-o",    out};
    argv.insert(argv.end(), k.extra.begin(), k.extra.end());
    const testing::CommandResult r = RunCommand(argv);
    EXPECT_NE(r.exit_code, 0) << k.message;
    EXPECT_TRUE(Contains(r.err, k.message)) << r.err;
  }
  const testing::CommandResult missing = RunCommand(
      {bin, "train-predictor", "--model", *model_, "--corpus", *dir_ + "/nothing.txt", "-o", out});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_TRUE(Contains(missing.err, "nothing.txt")) << missing.err;
  // Too little text to hold out calibration and test blocks.
  const testing::CommandResult tiny =
      RunCommand({bin, "train-predictor", "--model", *model_, "--corpus", Corpus(), "--tokens",
                  "300", "--window", "64", "-o", out});
  EXPECT_NE(tiny.exit_code, 0);
  EXPECT_TRUE(Contains(tiny.err, "too few tokens")) << tiny.err;
}

// SiLU models: active means |silu(gate)| >= the layer's cut from `thermocline profile`.
TEST_F(PredictorTrainingTest, SiluModelTrainsOnProfiledCuts) {
  const std::string bin = BinDir() + "/thermocline";
  const std::string model = testing::ModelPath("stories260K/stories260K.gguf");
  const std::string stats = *dir_ + "/stories_stats.gguf";
  const std::string out = *dir_ + "/stories_pred.gguf";
  const testing::CommandResult p =
      RunCommand({bin, "profile", "--model", model, "--corpus", Corpus(), "--tokens", "3000",
                  "--threads", "2", "-o", stats});
  ASSERT_EQ(p.exit_code, 0) << p.err;

  const testing::CommandResult no_stats =
      RunCommand({bin, "train-predictor", "--model", model, "--corpus", Corpus(), "-o", out});
  EXPECT_NE(no_stats.exit_code, 0);
  EXPECT_TRUE(Contains(no_stats.err, "SiLU model")) << no_stats.err;
  const testing::CommandResult bad_target =
      RunCommand({bin, "train-predictor", "--model", model, "--corpus", Corpus(), "--stats", stats,
                  "--stats-target", "0.55", "--tokens", "3000", "-o", out});
  EXPECT_NE(bad_target.exit_code, 0);
  EXPECT_TRUE(Contains(bad_target.err, "0.55")) << bad_target.err;

  const testing::CommandResult r = RunCommand({bin,
                                               "train-predictor",
                                               "--model",
                                               model,
                                               "--corpus",
                                               Corpus(),
                                               "--stats",
                                               stats,
                                               "--stats-target",
                                               "0.7",
                                               "--tokens",
                                               "6000",
                                               "--holdout",
                                               "0.2",
                                               "--rank",
                                               "64",
                                               "--epochs",
                                               "10",
                                               "--lr",
                                               "3e-3",
                                               "--threads",
                                               "2",
                                               "-o",
                                               out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::printf("%s", r.out.c_str());
  auto m = Model::Load(model);
  ASSERT_TRUE(m.ok()) << m.status();
  auto set = PredictorSet::Load(out, (*m)->config());
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->report().criterion, "magnitude");
  ASSERT_EQ(set->report().layers.size(), static_cast<size_t>((*m)->config().n_layers));
  for (const PredictorLayerReport& lr : set->report().layers) {
    EXPECT_GE(lr.recall, 0.95f);
    EXPECT_NEAR(lr.true_active, 0.3f, 0.05f);  // the cut of 70% sparsity, on other tokens
    EXPECT_GT(lr.precision, lr.true_active);
  }
}

}  // namespace
}  // namespace thermocline
