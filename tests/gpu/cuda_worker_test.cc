// The whole GPU worker with `--backend cuda` against `--backend host`, through the real worker
// processes (SplitEngine starts thermocline-gpu-worker and thermocline-cpu-worker and drives
// them through the shared-memory rings): the same synthetic ReLU model, the same placement and
// sparsity flags, the same batches (two slots, a prompt then decode steps), logits compared.
// Also: a --vram-budget the plan does not fit is refused with the bytes needed and the budget.
//
// Without a CUDA device every test skips with the reason.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_worker/cuda/cuda_backend.h"
#include "shared/driver/split_engine.h"
#include "shared/model/model.h"
#include "shared/sparsity/predictor.h"
#include "shared/sparsity/profiler.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::BinDir;

std::string SynthModel(const std::string& dir, const std::string& type) {
  const std::string path = dir + "/relu_" + type + ".gguf";
  const testing::CommandResult r = testing::RunCommand(
      {BinDir() + "/thermocline", "synth", "--ffn-kind", "relu-gated", "--dim", "128", "--ffn",
       "512", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--context",
       "64", "--type", type, "--seed", "7", "-o", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

// Predictors whose decisions are far from the threshold: neuron i's fc2 row is +1 or -1
// everywhere, so its score is +-sum(relu(fc1 h)) and the pick is the same fixed half of the
// neurons on the host (f32) and on the device (fp16): the test exercises the predicted path
// (selection, packing, per-row cold ids) without borderline flips.
std::string FixedPredictor(const std::string& dir, const Model& model) {
  const ModelConfig& c = model.config();
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::bernoulli_distribution pick(0.5);
  std::vector<PredictorWeights> layers(c.n_layers);
  for (PredictorWeights& p : layers) {
    p.rank = 32;
    p.fc1.resize(p.rank * c.dim);
    for (float& v : p.fc1) v = std::fabs(dist(rng));  // positive rows: relu(fc1 h) rarely all 0
    p.fc2.resize(c.ffn_dim * p.rank);
    for (int64_t i = 0; i < c.ffn_dim; ++i) {
      const float s = pick(rng) ? 1.0f : -1.0f;
      std::fill(p.fc2.begin() + i * p.rank, p.fc2.begin() + (i + 1) * p.rank, s);
    }
  }
  auto set = PredictorSet::FromWeights(layers, c, GgmlType::kF32, 0.0f);
  EXPECT_TRUE(set.ok()) << set.status();
  const std::string path = dir + "/fixed_predictor.gguf";
  EXPECT_TRUE(WritePredictors(*set, c, path).ok());
  return path;
}

// Bounds, relative to the RMS of a logits row: the device rounds the input of every dense
// product (q, k, v, o, the output head) to fp16, 2^-11 relative each, and sums in another
// order; through 2 layers and the head that is a few 1e-3 of the RMS, so 1e-2 for fp16
// weights. With Q8_0/Q4_0 FFN weights the host also quantizes each FFN input to Q8_0 (half a
// step, amax/254, per element: ~0.4% per dot product) where the device keeps fp32: 3e-2.
constexpr double kF16Bound = 1e-2, kQuantBound = 3e-2;

class CudaWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status s = gpu_worker::CudaAvailable();
    if (!s.ok()) GTEST_SKIP() << "no CUDA device: " << s.message();
    dir_ = testing::TempDir();
  }

  driver::SplitEngineOptions Options(const std::string& path, const Model& model,
                                     double hot, const SparsityFlags& flags) {
    driver::SplitEngineOptions o;
    o.model_path = path;
    o.config = model.config();
    o.hot_fraction = hot;
    o.sparsity = flags;
    o.kv_slots = 2;
    o.context = 64;
    o.bindir = BinDir();
    return o;
  }

  // Two slots: a 6-token prompt on slot 0 and a 3-token one on slot 1 in one step, then 6
  // decode steps of both; every entry wants logits. Returns every logits row in order.
  static absl::StatusOr<std::vector<std::vector<float>>> Drive(BatchRunner& runner,
                                                               int64_t vocab) {
    std::vector<std::vector<float>> rows;
    std::vector<BatchEntry> batch;
    for (int p = 0; p < 6; ++p) batch.push_back({0, p, 5 + 7 * p, true});
    for (int p = 0; p < 3; ++p) batch.push_back({1, p, 100 + 3 * p, true});
    std::vector<float> logits;
    for (int step = 0; step < 7; ++step) {
      if (absl::Status s = runner.Run(batch, logits); !s.ok()) return s;
      for (size_t r = 0; r < batch.size(); ++r) {
        rows.emplace_back(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      }
      batch = {{0, 6 + step, 20 + step, true}, {1, 3 + step, 300 + step, true}};
    }
    return rows;
  }

  void Compare(const std::string& type, const std::string& mode, double hot, double bound) {
    const std::string path = SynthModel(dir_, type);
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status();
    SparsityFlags flags;
    flags.mode = mode;
    if (mode == "predicted") flags.predictor_path = FixedPredictor(dir_, **model);
    CompareBackends(path, **model, flags, hot, bound, type + " " + mode);
  }

  // A ReLU MoE model (4 experts, 2 used) under threshold: each expert's cuts profiled here
  // (over fixed pseudo-random ids: the bundle carries no corpus), the workers read the file.
  void CompareThresholdMoe(const std::string& arch, double hot) {
    const std::string path = dir_ + "/moe_" + arch + ".gguf";
    const testing::CommandResult r = testing::RunCommand(
        {BinDir() + "/thermocline", "synth", "--arch", arch, "--experts", "4", "--ffn-kind",
         "relu-gated", "--dim", "128", "--ffn", "256", "--layers", "2", "--heads", "4",
         "--kv-heads", "2", "--vocab", "512", "--context", "64", "--seed", "17",
         "--active-fraction", "0", "--type", "f16", "-o", path});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE((*model)->config().moe());
    std::vector<int32_t> ids(1024);
    std::mt19937 rng(5);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 512);
    ProfileOptions po;
    po.window = 64;
    po.batch = 64;
    ThreadPool pool(1);
    auto profile = ProfileActivations(**model, ids, po, pool);
    ASSERT_TRUE(profile.ok()) << profile.status();
    SparsityFlags flags;
    flags.mode = "threshold";
    flags.stats_path = dir_ + "/moe_stats_" + arch + ".gguf";
    ASSERT_TRUE(WriteActivationStats(profile->stats, flags.stats_path).ok());
    flags.target_sparsity = 0.8f;
    flags.gate_sparsity = 0.7f;
    CompareBackends(path, **model, flags, hot, kF16Bound, arch + " moe threshold");
  }

  void CompareBackends(const std::string& path, const Model& model, const SparsityFlags& flags,
                       double hot, double bound, const std::string& name) {
    const int64_t vocab = model.config().vocab_size;
    driver::SplitEngineOptions host_o = Options(path, model, hot, flags);
    driver::SplitEngineOptions cuda_o = host_o;
    cuda_o.gpu_backend = "cuda";
    std::vector<std::vector<float>> want, got;
    {
      auto host = driver::SplitEngine::Create(host_o);
      ASSERT_TRUE(host.ok()) << host.status();
      auto rows = Drive(**host, vocab);
      ASSERT_TRUE(rows.ok()) << rows.status();
      want = *rows;
    }
    {
      auto cuda = driver::SplitEngine::Create(cuda_o);
      ASSERT_TRUE(cuda.ok()) << cuda.status();
      auto rows = Drive(**cuda, vocab);
      ASSERT_TRUE(rows.ok()) << rows.status();
      got = *rows;
      EXPECT_EQ((*cuda)->stats().restarts, 0);
    }
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t t = 0; t < want.size(); ++t) {
      double sq = 0;
      for (float v : want[t]) sq += static_cast<double>(v) * v;
      const double scale = std::max(1.0, std::sqrt(sq / want[t].size()));
      for (size_t i = 0; i < want[t].size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(got[t][i]) - want[t][i]) / scale);
      }
    }
    std::printf("%s hot %.2f: max |cuda - host| / max(1, RMS) = %.3g (bound %g)\n",
                name.c_str(), hot, worst, bound);
    EXPECT_LE(worst, bound);
  }

  std::string dir_;
};

TEST_F(CudaWorkerTest, DenseHalfHotF16) { Compare("f16", "dense", 0.5, kF16Bound); }
TEST_F(CudaWorkerTest, ExactHalfHotF16) { Compare("f16", "exact", 0.5, kF16Bound); }
TEST_F(CudaWorkerTest, DenseAllHotF32) { Compare("f32", "dense", 1.0, kF16Bound); }
TEST_F(CudaWorkerTest, ExactAllColdQ8) { Compare("q8_0", "exact", 0.0, kQuantBound); }
TEST_F(CudaWorkerTest, ExactHalfHotQ8) { Compare("q8_0", "exact", 0.5, kQuantBound); }
TEST_F(CudaWorkerTest, ExactHalfHotQ4) { Compare("q4_0", "exact", 0.5, kQuantBound); }
TEST_F(CudaWorkerTest, PredictedHalfHotQ4) { Compare("q4_0", "predicted", 0.5, kQuantBound); }
TEST_F(CudaWorkerTest, PredictedAllHotF16) { Compare("f16", "predicted", 1.0, kF16Bound); }
// Threshold MoE: each expert's own cuts on the device (row_cut) and on the cpu worker, and the
// shared expert (qwen2moe) unfiltered, as the host backend runs them.
TEST_F(CudaWorkerTest, ThresholdMoeHalfHotLlama) { CompareThresholdMoe("llama", 0.5); }
TEST_F(CudaWorkerTest, ThresholdMoeAllHotQwen2Moe) { CompareThresholdMoe("qwen2moe", 1.0); }

TEST_F(CudaWorkerTest, BudgetTooSmallIsRefusedWithBytes) {
  const std::string path = SynthModel(dir_, "q8_0");
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  driver::SplitEngineOptions o = Options(path, **model, 0.5, SparsityFlags{});
  o.gpu_backend = "cuda";
  o.extra_gpu_args = {"--vram-budget", "64K"};
  o.log_path = dir_ + "/workers.log";
  o.restart.max_restarts = 0;
  o.ready_timeout = absl::Seconds(30);
  auto engine = driver::SplitEngine::Create(o);
  ASSERT_FALSE(engine.ok()) << "a 64 KiB budget cannot hold the model's device part";
  const std::string log = testing::ReadFileOrDie(o.log_path);
  EXPECT_NE(log.find("needs"), std::string::npos) << log;
  EXPECT_NE(log.find("--vram-budget is 65536 bytes"), std::string::npos) << log;
}

}  // namespace
}  // namespace thermocline
