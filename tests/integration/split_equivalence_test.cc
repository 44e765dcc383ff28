// Split execution (SplitEngine: thermocline-gpu-worker + thermocline-cpu-worker, real
// processes) against the single-process engine (ForwardPass with DenseFfn, or SparseFfn under
// the same SparsityPlan), both driven by the same Generate loop, greedy: the same tokens, and
// every sampled-from logits row within the bound below. Models: stories260K (SwiGLU, shipped
// GGUF), aidreams260K (SwiGLU, other shapes, converted from llama2.c by `thermocline convert`),
// and a small synthetic ReLU-gated model in PowerInfer's layout (carries fc1/fc2 predictors);
// hot fractions 0, 0.5 and 1. Modes: `dense` and `predicted` everywhere (the ReLU model's own
// predictors; on the SiLU models predictors trained by `thermocline train-predictor` with the
// magnitude cuts of `thermocline profile`), and `threshold` on the SiLU models; and TEAL on
// attention (per-token top-k 50% of q, k, v, o inputs, in the gpu worker's forward pass) with
// threshold and predicted FFNs. Also `generate --split` prints exactly what local
// `generate` prints, and leaves nothing in /dev/shm.
//
// The logits bound (the workers' argument, docs/workers.md and worker_processes_test.cc): each
// neuron's product is bit-identical to the single-process engine's and both sides filter with
// SparsityPlan::FilterFor, so they compute the same neurons; only the order of the down
// projection's sum may differ.
//   - Bound 0 (bit-identical) where the order is the same: hot fraction 1 in every mode, and
//     hot fraction 0 in the sparse modes (NeuronFfn over all candidates in order on one side).
//   - Elsewhere (dense at hot 0: axpy over rows instead of dot products; any mode at 0.5:
//     y_hot + y_cold instead of one running sum): float reassociation, at most ~n * 2^-24 *
//     sum|terms| per FFN output element of n terms (n <= 172 here, values of order 1: ~1e-5),
//     carried through 2-5 layers and the head: bounded by 1e-4 * max(1, RMS of the reference
//     row). Measured: at most 3.5e-6 (stories260K dense, hot 0), ~1e-6 on the others; the
//     ReLU model at hot 0 dense is bit-identical too (its ffn_down_t makes both sides axpy).
//     Tokens must still be identical: a reassociation this small flips an argmax only on
//     an exact tie, which these prompts do not have.
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/driver/split_engine.h"
#include "shared/ipc/segment.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/sparsity_setup.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_profile.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

constexpr double kTolerance = 1e-4;  // relative to max(1, RMS); see the top of the file
constexpr int kNewTokens = 40;

std::string Corpus() { return testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt"; }
std::string Thermocline() { return testing::BinDir() + "/thermocline"; }

const std::string& Stories() {
  static const std::string p = testing::ModelPath("stories260K/stories260K.gguf");
  return p;
}

// aidreams260K ships as a llama2.c checkpoint: converted once per test binary.
const std::string& Aidreams() {
  static const std::string path = [] {
    const std::string out = testing::TempDir() + "/aidreams260K-f32.gguf";
    auto r = testing::RunCommand({Thermocline(), "convert", "--from", "llama2c",
                                  testing::ModelPath("aidreams260K/aidreams260K.bin"),
                                  testing::ModelPath("aidreams260K/tok512.bin"), "-o", out,
                                  "--type", "f32"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
  }();
  return path;
}

// A small synthetic ReLU-gated model in PowerInfer's layout (with predictors).
const std::string& Relu() {
  static const std::string path = [] {
    const std::string dir = testing::TempDir();
    const std::string base = dir + "/relu.gguf", pwri = dir + "/relu.powerinfer.gguf";
    auto r = testing::RunCommand(
        {Thermocline(), "synth", "--ffn-kind", "relu-gated", "--dim", "64", "--ffn", "128",
         "--layers", "2", "--heads", "4", "--kv-heads", "2", "--vocab", "300", "--context", "64",
         "--seed", "5", "--threads", "1", "--powerinfer-output", pwri, "-o", base});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return pwri;
  }();
  return path;
}

// TEAL's calibrated cuts of a model at a model-level target of 0.5.
std::string TealProfile(const std::string& model) {
  const std::string out = testing::TempDir() + "/teal.gguf";
  const testing::CommandResult r = testing::CalibrateTealProfile(model, out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

// Activation statistics (threshold cuts) of a SiLU model, once per (model, test binary).
std::string Stats(const std::string& model) {
  const std::string out = testing::TempDir() + "/stats.gguf";
  auto r = testing::RunCommand({Thermocline(), "profile", "-m", model, "--corpus", Corpus(),
                                "--tokens", "600", "--window", "64", "--targets", "0.2,0.5",
                                "--threads", "1", "-o", out});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

// Predictors for a SiLU model, trained on its 0.5 magnitude cuts (a small, quick training: the
// test needs a real predictor file, not a good one).
std::string Predictor(const std::string& model, const std::string& stats) {
  const std::string out = testing::TempDir() + "/predictor.gguf";
  auto r = testing::RunCommand({Thermocline(), "train-predictor", "-m", model, "--corpus",
                                Corpus(), "--tokens", "2000", "--window", "64", "--epochs", "3",
                                "--stats", stats, "--stats-target", "0.5", "--threads", "1",
                                "-o", out});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

struct Output {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // the row each token was sampled from
};

GenerationRequest Request(const Model& model, const std::string& prompt) {
  GenerationRequest req;
  req.prompt = model.tokenizer().Encode(prompt, /*add_bos=*/true);
  req.max_new_tokens = kNewTokens;
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  return req;
}

Output Collect(BatchRunner& runner, const Model& model, const GenerationRequest& req) {
  Output out;
  auto stats = Generate(runner, model.tokenizer().eos(), req,
                        [&](int32_t token, std::span<const float> logits) {
                          out.tokens.push_back(token);
                          out.logits.emplace_back(logits.begin(), logits.end());
                          return true;
                        });
  EXPECT_TRUE(stats.ok()) << stats.status();
  return out;
}

// The single-process engine, one thread (the order of SparseFfn's sums with one thread is the
// order the workers use).
Output Local(const Model& model, const SparsityFlags& flags, const TealFlags& teal_flags,
             const GenerationRequest& req) {
  auto setup = SparsitySetupFromFlags(model, flags, teal_flags);
  EXPECT_TRUE(setup.ok()) << setup.status();
  if (!setup.ok()) return {};
  ThreadPool pool(1);
  auto kv = KvCache::Create(model.config(), 1, model.config().context_length, GgmlType::kF32);
  EXPECT_TRUE(kv.ok());
  auto executors = BuildLocalExecutors(model, std::move(*setup), pool);
  EXPECT_TRUE(executors.ok()) << executors.status();
  if (!executors.ok()) return {};
  ForwardPass pass(model, *kv, pool, executors->ffn.get(), executors->teal.get());
  ForwardPassRunner runner(pass);
  return Collect(runner, model, req);
}

struct Case {
  const char* name;
  const std::string& (*model)();
  const char* mode;
  double hot;
  const char* prompt;
  float teal = 0;  // > 0: TEAL on attention at this per-token share
  // mode "teal": TEAL on every projection at the calibrated target 0.5, the FFN's inputs split
  // between the workers.
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SplitEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(SplitEquivalence, SameTokensAndLogitsAsOneProcess) {
  const Case& c = GetParam();
  const std::string path = c.model();
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  SparsityFlags flags;
  flags.mode = c.mode;
  const bool silu = (*model)->config().activation == FfnActivation::kSilu;
  if (flags.mode == "threshold" || (flags.mode == "predicted" && silu)) {
    flags.stats_path = Stats(path);
    flags.target_sparsity = 0.5f;
  }
  if (flags.mode == "predicted" && silu) flags.predictor_path = Predictor(path, flags.stats_path);
  const GenerationRequest req = Request(**model, c.prompt);
  TealFlags teal;
  if (c.teal > 0) teal.sparsity = c.teal;
  const bool teal_ffn = flags.mode == "teal";
  if (teal_ffn) {
    teal.sparsity = 0.5f;
    teal.profile_path = TealProfile(path);
  }
  const Output local = Local(**model, flags, teal, req);
  if (c.teal > 0 || teal_ffn) {
    // TEAL changes the computation, so a split without it could not pass for one with it.
    SparsityFlags plain = flags;
    if (teal_ffn) plain.mode = "dense";
    EXPECT_NE(Local(**model, plain, {}, req).logits, local.logits);
  }

  driver::SplitEngineOptions o;
  o.model_path = path;
  o.config = (*model)->config();
  o.hot_fraction = c.hot;
  o.sparsity = flags;
  o.teal = teal;
  // The cpu worker then locks its TEAL copies with its cold rows (--mlock), as a deployment
  // would; a few hundred KiB, under the unprivileged default limit.
  o.mlock = teal_ffn;
  o.kv_slots = 1;
  o.bindir = testing::BinDir();
  std::string instance;
  Output split;
  {
    auto engine = driver::SplitEngine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    instance = (*engine)->instance();
    split = Collect(**engine, **model, req);
    EXPECT_EQ((*engine)->stats().restarts, 0);
  }
  EXPECT_TRUE(ipc::ListInstanceSegments(instance).empty()) << "segment left after a clean exit";

  ASSERT_EQ(split.tokens, local.tokens);
  // The order of the sums is one process's where one side holds every neuron, except that the
  // CPU worker sums a dense (or TEAL's prompt) row by neuron, not as a GEMM.
  const bool same_order =
      c.hot == 1 || (c.hot == 0 && flags.mode != "dense" && flags.mode != "teal");
  double worst = 0;
  for (size_t t = 0; t < local.logits.size(); ++t) {
    const std::vector<float>& ref = local.logits[t];
    double sq = 0;
    for (float v : ref) sq += static_cast<double>(v) * v;
    const double scale = std::max(1.0, std::sqrt(sq / ref.size()));
    for (size_t i = 0; i < ref.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(split.logits[t][i]) - ref[i]) / scale);
    }
  }
  std::printf("%s: max |split - local| / max(1, RMS) = %.3g (bound %g)\n", c.name, worst,
              same_order ? 0.0 : kTolerance);
  if (same_order) {
    EXPECT_EQ(worst, 0) << "the arithmetic order is the same: expected bit-identical logits";
  } else {
    EXPECT_LE(worst, kTolerance);
  }
}

const char kOnce[] = "Once upon a time";
const char kDreamed[] = "I dreamed";

INSTANTIATE_TEST_SUITE_P(
    Models, SplitEquivalence,
    ::testing::Values(Case{"stories_dense_hot0", &Stories, "dense", 0, kOnce},
                      Case{"stories_dense_hot05", &Stories, "dense", 0.5, kOnce},
                      Case{"stories_dense_hot1", &Stories, "dense", 1, kOnce},
                      Case{"stories_threshold_hot0", &Stories, "threshold", 0, kOnce},
                      Case{"stories_threshold_hot05", &Stories, "threshold", 0.5, kOnce},
                      Case{"stories_threshold_hot1", &Stories, "threshold", 1, kOnce},
                      Case{"stories_predicted_hot0", &Stories, "predicted", 0, kOnce},
                      Case{"stories_predicted_hot05", &Stories, "predicted", 0.5, kOnce},
                      Case{"stories_predicted_hot1", &Stories, "predicted", 1, kOnce},
                      Case{"aidreams_dense_hot0", &Aidreams, "dense", 0, kDreamed},
                      Case{"aidreams_dense_hot05", &Aidreams, "dense", 0.5, kDreamed},
                      Case{"aidreams_dense_hot1", &Aidreams, "dense", 1, kDreamed},
                      Case{"aidreams_threshold_hot0", &Aidreams, "threshold", 0, kDreamed},
                      Case{"aidreams_threshold_hot05", &Aidreams, "threshold", 0.5, kDreamed},
                      Case{"aidreams_threshold_hot1", &Aidreams, "threshold", 1, kDreamed},
                      Case{"aidreams_predicted_hot0", &Aidreams, "predicted", 0, kDreamed},
                      Case{"aidreams_predicted_hot05", &Aidreams, "predicted", 0.5, kDreamed},
                      Case{"aidreams_predicted_hot1", &Aidreams, "predicted", 1, kDreamed},
                      Case{"relu_dense_hot0", &Relu, "dense", 0, kOnce},
                      Case{"relu_dense_hot05", &Relu, "dense", 0.5, kOnce},
                      Case{"relu_dense_hot1", &Relu, "dense", 1, kOnce},
                      Case{"relu_predicted_hot0", &Relu, "predicted", 0, kOnce},
                      Case{"relu_predicted_hot05", &Relu, "predicted", 0.5, kOnce},
                      Case{"relu_predicted_hot1", &Relu, "predicted", 1, kOnce},
                      Case{"stories_threshold_teal_hot05", &Stories, "threshold", 0.5, kOnce, 0.5f},
                      Case{"relu_predicted_teal_hot0", &Relu, "predicted", 0, kOnce, 0.5f},
                      Case{"relu_predicted_teal_hot05", &Relu, "predicted", 0.5, kOnce, 0.5f},
                      Case{"relu_predicted_teal_hot1", &Relu, "predicted", 1, kOnce, 0.5f},
                      Case{"stories_teal_hot0", &Stories, "teal", 0, kOnce},
                      Case{"stories_teal_hot05", &Stories, "teal", 0.5, kOnce},
                      Case{"stories_teal_hot1", &Stories, "teal", 1, kOnce},
                      Case{"aidreams_teal_hot05", &Aidreams, "teal", 0.5, kDreamed}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// A batch longer than a step (max_batch) or wanting more rows than a step returns
// (max_logits_rows) is cut into steps in order; the caller sees one Run with every row, equal
// to one ForwardPass::Run over the whole batch. Entries that break the position rule are
// refused before anything is sent, and the engine goes on.
TEST(SplitEngineBatches, LongBatchesAreCutIntoStepsAndBadOnesRefused) {
  auto model = Model::Load(Relu());
  ASSERT_TRUE(model.ok()) << model.status();
  // Two slots, the second prompt interleaved with the first; every entry wants logits.
  std::vector<BatchEntry> batch;
  for (int32_t p = 0; p < 9; ++p) {
    batch.push_back({0, p, 1 + 7 * p, true});
    if (p < 5) batch.push_back({1, p, 2 + 11 * p, true});
  }
  ThreadPool pool(1);
  auto kv = KvCache::Create((*model)->config(), 2, 64, GgmlType::kF32);
  ASSERT_TRUE(kv.ok());
  ForwardPass pass(**model, *kv, pool);
  std::vector<float> want;
  ASSERT_TRUE(pass.Run(batch, want).ok());

  driver::SplitEngineOptions o;
  o.model_path = Relu();
  o.config = (*model)->config();
  o.hot_fraction = 1;  // bit-identical arithmetic: any difference is a batching error
  o.kv_slots = 2;
  o.context = 64;
  o.max_batch = 4;
  o.max_logits_rows = 3;
  o.bindir = testing::BinDir();
  auto engine = driver::SplitEngine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<float> got;
  ASSERT_TRUE((*engine)->Run(batch, got).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ((*engine)->stats().steps, 5);  // 14 rows, at most 3 per step
  EXPECT_EQ((*engine)->history().tokens(0).size(), 9u);
  EXPECT_EQ((*engine)->history().tokens(1).size(), 5u);

  const BatchEntry gap{1, 7, 3, true};  // slot 1 holds 5 positions
  absl::Status s = (*engine)->Run(std::span<const BatchEntry>(&gap, 1), got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const BatchEntry bad_token{0, 9, 100000, true};
  EXPECT_EQ((*engine)->Run(std::span<const BatchEntry>(&bad_token, 1), got).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->stats().steps, 5) << "nothing was sent";
  // The next good step still works, and matches the single process.
  const BatchEntry next{1, 5, 42, true};
  ASSERT_TRUE(pass.Run(std::span<const BatchEntry>(&next, 1), want).ok());
  ASSERT_TRUE((*engine)->Run(std::span<const BatchEntry>(&next, 1), got).ok());
  EXPECT_EQ(got, want);
}

// The command line: `generate --split` prints what local `generate` prints, and cleans up.
TEST(SplitGenerateCommand, PrintsWhatLocalGenerationPrints) {
  const std::vector<std::string> common = {Thermocline(), "generate", "-m", Stories(), "-p",
                                           kOnce, "-n", "48", "-t", "0", "--threads", "1"};
  const testing::CommandResult local = testing::RunCommand(common);
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::string instance = absl::StrCat("splitcli-", getpid());
  std::vector<std::string> split = common;
  split.insert(split.end(), {"--split", "--hot-fraction", "0.5", "--gpu-threads", "1",
                             "--cpu-threads", "1", "--instance", instance});
  const testing::CommandResult r = testing::RunCommand(split);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, local.out);
  EXPECT_NE(r.err.find("0 worker restarts"), std::string::npos) << r.err;
  EXPECT_TRUE(ipc::ListInstanceSegments(instance).empty());

  // Misuse is refused with a clear message before anything starts.
  std::vector<std::string> both = common;
  both.insert(both.end(), {"--split", "--hot-fraction", "0.5", "--plan", "p.gguf"});
  const testing::CommandResult bad = testing::RunCommand(both);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("not both"), std::string::npos) << bad.err;
  std::vector<std::string> teal_ffn = common;
  teal_ffn.insert(teal_ffn.end(), {"--split", "--hot-fraction", "0.5", "--sparsity", "teal",
                                   "--teal-sparsity", "0.5"});
  const testing::CommandResult refused = testing::RunCommand(teal_ffn);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("--sparsity teal over the split workers needs --teal-profile"),
            std::string::npos)
      << refused.err;

  // TEAL over the split FFN prints what local TEAL prints (the same profile); --mlock reaches
  // the cpu worker, which locks its cold rows and TEAL copies.
  const std::string profile = TealProfile(Stories());
  std::vector<std::string> teal_local = common;
  teal_local.insert(teal_local.end(),
                    {"--sparsity", "teal", "--teal-sparsity", "0.5", "--teal-profile", profile});
  const testing::CommandResult teal_want = testing::RunCommand(teal_local);
  ASSERT_EQ(teal_want.exit_code, 0) << teal_want.err;
  EXPECT_NE(teal_want.out, local.out);
  std::vector<std::string> teal_split = teal_local;
  teal_split.insert(teal_split.end(), {"--split", "--hot-fraction", "0.5", "--instance",
                                       instance + "-teal", "--mlock"});
  const testing::CommandResult teal_got = testing::RunCommand(teal_split);
  ASSERT_EQ(teal_got.exit_code, 0) << teal_got.err;
  EXPECT_EQ(teal_got.out, teal_want.out);
  EXPECT_NE(teal_got.err.find("event=teal copy_bytes="), std::string::npos) << teal_got.err;
  EXPECT_EQ(teal_got.err.find("locked=false"), std::string::npos) << teal_got.err;
  EXPECT_NE(teal_got.err.find("locked=true"), std::string::npos) << teal_got.err;
  for (const char* split_only : {"--hot-fraction", "--mlock"}) {
    std::vector<std::string> stray = common;
    stray.push_back(split_only);
    if (std::string(split_only) == "--hot-fraction") stray.push_back("0.5");
    EXPECT_NE(testing::RunCommand(stray).err.find(std::string(split_only) + " needs --split"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace thermocline
