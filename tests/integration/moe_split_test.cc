// Mixture-of-experts layers split per expert over the two worker processes (SplitEngine with
// real thermocline-gpu-worker and thermocline-cpu-worker) against the single-process engine, on
// synthetic ReLU MoE models made by `thermocline synth --experts 4`: llama-MoE (Mixtral-style)
// and qwen2moe (with its shared expert, which stays whole on the gpu worker); modes dense,
// exact and threshold (each expert's cuts profiled here).
//
// The gpu worker routes once and sends the picks and their weights with h; each side computes
// its neurons of every chosen expert and weights them by the router. Bound (as in
// split_equivalence_test.cc): bit-identical where the arithmetic order is the same (hot 1:
// DenseFfn for dense, SparseFfn's per-expert NeuronFfn for exact), else the reassociation of
// each expert's down sum (y_hot + y_cold): 1e-4 * max(1, RMS of the reference row); the greedy
// tokens must be the same. The cpu worker's metrics must show the cold share of each chosen
// expert computed there: the candidates it considered are, over every row and MoE layer, the
// sum of the cold neurons of the experts the router picked, recomputed here from the dense
// pass's own routing.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/driver/split_engine.h"
#include "shared/ipc/segment.h"
#include "shared/ipc/worker_metrics.h"
#include "shared/model/model.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/profiler.h"
#include "shared/sparsity/sparse_ffn.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

constexpr double kTolerance = 1e-4;  // relative to max(1, RMS); see the top of the file
constexpr int kPrompt = 12;
constexpr int kSteps = 6;

std::string Synth(const std::string& arch) {
  const std::string path = testing::TempDir() + "/moe_split_" + arch + ".gguf";
  auto r = testing::RunCommand({testing::BinDir() + "/thermocline", "synth", "--arch", arch,
                                "--experts", "4", "--ffn-kind", "relu-gated", "--dim", "64",
                                "--ffn", "96", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                                "--vocab", "300", "--context", "64", "--seed", "17",
                                "--active-fraction", "0", "--threads", "1", "-o", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

// The dense (or exact) FFN, recording the router's picks of every row it computes.
class RoutingRecorder final : public FfnExecutor {
 public:
  RoutingRecorder(const Model& model, FfnExecutor& inner, ThreadPool& pool)
      : model_(model), inner_(inner), pool_(pool) {}
  using FfnExecutor::Compute;
  void Compute(int64_t layer, const float* h, const float* predictor_input, int64_t n_tokens,
               float* out) override {
    if (model_.config().layers[layer].moe) {
      RouteExperts(model_.config(), model_.layer(layer), h, n_tokens, pool_, probs_, picks_,
                   weights_);
      for (int32_t e : picks_) picks.push_back({layer, e});
    }
    inner_.Compute(layer, h, predictor_input, n_tokens, out);
  }
  std::vector<std::pair<int64_t, int32_t>> picks;  // (layer, expert) of every row's picks

 private:
  const Model& model_;
  FfnExecutor& inner_;
  ThreadPool& pool_;
  std::vector<float> probs_, weights_;
  std::vector<int32_t> picks_;
};

struct GreedyRun {
  std::vector<float> logits;  // the prompt's rows, then one row per step
  std::vector<int32_t> tokens;
};

// The prompt as one batch, then kSteps greedy single-token steps.
GreedyRun Greedy(BatchRunner& runner) {
  GreedyRun out;
  std::vector<BatchEntry> batch;
  for (int32_t p = 0; p < kPrompt; ++p) batch.push_back({0, p, (p * 37 + 11) % 300, true});
  EXPECT_TRUE(runner.Run(batch, out.logits).ok());
  for (int s = 0; s < kSteps && out.logits.size() >= 300; ++s) {
    const float* last = out.logits.data() + out.logits.size() - 300;
    const int32_t pick = static_cast<int32_t>(std::max_element(last, last + 300) - last);
    out.tokens.push_back(pick);
    BatchEntry e{0, kPrompt + s, pick, true};
    std::vector<float> row;
    EXPECT_TRUE(runner.Run({&e, 1}, row).ok());
    out.logits.insert(out.logits.end(), row.begin(), row.end());
  }
  return out;
}

void ExpectClose(const GreedyRun& got, const GreedyRun& want, bool bit_identical) {
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  double worst = 0;
  for (size_t r = 0; r < want.logits.size() / 300; ++r) {
    double ss = 0, d = 0;
    for (size_t i = 0; i < 300; ++i) {
      const double w = want.logits[r * 300 + i];
      ss += w * w;
      d = std::max(d, std::abs(got.logits[r * 300 + i] - w));
      if (bit_identical) {
        ASSERT_EQ(got.logits[r * 300 + i], want.logits[r * 300 + i]) << "row " << r;
      }
    }
    const double bound = kTolerance * std::max(1.0, std::sqrt(ss / 300));
    ASSERT_LE(d, bound) << "row " << r;
    worst = std::max(worst, d / bound);
  }
  std::printf("  worst row at %.3g of its bound\n", worst);
}

struct SplitCase {
  const char* arch;
  const char* mode;
};

class MoeSplitTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(MoeSplitTest, SplitPerExpertEqualsOneProcess) {
  const SplitCase& sc = GetParam();
  const std::string path = Synth(sc.arch);
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  ASSERT_TRUE(c.moe());
  const SparsityMode mode = *ParseSparsityMode(sc.mode);
  ThreadPool pool(1);
  SparsityFlags flags;
  flags.mode = sc.mode;
  if (mode == SparsityMode::kThreshold) {
    // Each expert's cuts, profiled here over a corpus; the workers read the same file.
    auto tokens = TokenizeCorpusFile(testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt",
                                     (*model)->tokenizer(), 1000);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    ProfileOptions po;
    po.window = 64;
    po.batch = 64;
    auto profile = ProfileActivations(**model, *tokens, po, pool);
    ASSERT_TRUE(profile.ok()) << profile.status();
    flags.stats_path = testing::TempDir() + "/moe_split_stats_" + sc.arch + ".gguf";
    ASSERT_TRUE(WriteActivationStats(profile->stats, flags.stats_path).ok());
    flags.target_sparsity = 0.8f;
    flags.gate_sparsity = 0.7f;
  }

  // The reference: one process, the same plan, with the routing it took.
  auto plan = SparsityPlanFromFlags(**model, flags);
  ASSERT_TRUE(plan.ok()) << plan.status();
  DenseFfn dense(**model, pool);
  auto sparse = SparseFfn::Create(**model, *plan, pool);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  FfnExecutor& inner = mode == SparsityMode::kDense ? static_cast<FfnExecutor&>(dense) : **sparse;
  RoutingRecorder recorder(**model, inner, pool);
  auto kv = KvCache::Create(c, 1, 64, GgmlType::kF32);
  ASSERT_TRUE(kv.ok());
  ForwardPass pass(**model, *kv, pool, &recorder);
  ForwardPassRunner local(pass);
  const GreedyRun want = Greedy(local);
  ASSERT_EQ(want.tokens.size(), static_cast<size_t>(kSteps));

  // An uneven plan: expert e keeps e quarters of its neurons hot (expert 0 all cold, expert 3
  // three quarters hot), shifted per layer so that hot neurons are not always the lowest ids.
  Placement uneven;
  uneven.layers.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerPlacement& lp = uneven.layers[l];
    lp.on_gpu.assign(LayerNeurons(c, l), 0);
    for (int64_t e = 0; e < c.n_experts; ++e) {
      for (int64_t i = 0; i < c.ffn_dim * e / 4; ++i) {
        const int64_t id = e * c.ffn_dim + (i + 7 * l) % c.ffn_dim;
        lp.on_gpu[id] = 1;
      }
    }
    for (int32_t id = 0; id < static_cast<int32_t>(lp.on_gpu.size()); ++id) {
      if (lp.on_gpu[id]) lp.gpu_bucket.push_back(id);
    }
  }
  const std::string plan_path = testing::TempDir() + "/moe_split_plan_" + sc.arch + ".gguf";
  ASSERT_TRUE(WritePlacement(uneven, plan_path).ok());

  static int counter = 0;
  for (double hot : {0.0, 0.5, 1.0, -1.0}) {  // -1: the uneven plan file
    SCOPED_TRACE(hot);
    std::printf("%s %s hot %g:\n", sc.arch, sc.mode, hot);
    driver::SplitEngineOptions o;
    o.instance = "moesplit-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    o.model_path = path;
    o.config = c;
    if (hot >= 0) {
      o.hot_fraction = hot;
    } else {
      o.plan_path = plan_path;
    }
    o.sparsity = flags;
    o.kv_slots = 1;
    o.context = 64;
    o.bindir = testing::BinDir();
    auto placement = hot >= 0 ? Placement::Uniform(c, hot) : uneven;
    auto part = Partition::FromPlacement(placement, c);
    ASSERT_TRUE(part.ok()) << part.status();
    uint64_t expected_candidates = 0, cold_layers = 0;
    for (const auto& [layer, e] : recorder.picks) {
      expected_candidates += ExpertSlice(part->layers[layer].cold, e, c.ffn_dim).size();
    }
    for (const LayerPartition& lp : part->layers) cold_layers += lp.cold.empty() ? 0 : 1;
    {
      auto metrics = ipc::WorkerMetricsRegion::Create(o.instance);
      ASSERT_TRUE(metrics.ok()) << metrics.status();
      auto engine = driver::SplitEngine::Create(o);
      ASSERT_TRUE(engine.ok()) << engine.status();
      const GreedyRun got = Greedy(**engine);
      ExpectClose(got, want, hot == 1.0);
      EXPECT_EQ((*engine)->stats().restarts, 0);
      auto cpu = (*metrics)->Read(ipc::Role::kCpuWorker);
      ASSERT_TRUE(cpu.ok()) << cpu.status();
      EXPECT_EQ(cpu->activations, (1 + kSteps) * cold_layers);
      EXPECT_EQ(cpu->candidate_neurons, expected_candidates);
      if (mode == SparsityMode::kDense || hot == 1.0) {
        EXPECT_EQ(cpu->active_neurons, expected_candidates);
      } else {
        // ReLU (or the cuts) within each expert: a part of the cold candidates runs.
        EXPECT_LT(cpu->active_neurons, expected_candidates);
        EXPECT_GT(cpu->active_neurons, expected_candidates / 10);
      }
      EXPECT_EQ(expected_candidates == 0, hot == 1.0);
    }
    EXPECT_TRUE(ipc::ListInstanceSegments(o.instance).empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, MoeSplitTest,
                         ::testing::Values(SplitCase{"llama", "dense"}, SplitCase{"llama", "exact"},
                                           SplitCase{"llama", "threshold"},
                                           SplitCase{"qwen2moe", "dense"},
                                           SplitCase{"qwen2moe", "exact"},
                                           SplitCase{"qwen2moe", "threshold"}),
                         [](const ::testing::TestParamInfo<SplitCase>& info) {
                           return std::string(info.param.arch) + "_" + info.param.mode;
                         });

}  // namespace
}  // namespace thermocline
