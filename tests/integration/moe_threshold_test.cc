// Threshold mode inside mixture-of-experts layers, on synthetic ReLU MoE models (llama-MoE and
// qwen2moe, 4 experts, 2 used): each routed expert has its own calibrated cuts.
//   - With every expert's cuts at 0, threshold selects exactly the exact mode's neurons: the
//     logits are bit-identical.
//   - `profile` calibrates per expert: a reference computed here (the dense pass, routed by
//     RouteExperts, each expert's gate and up rows multiplied out) gives every expert neuron's
//     frequency over the tokens sent to that expert exactly, and each expert's cut splits that
//     expert's own values at the target share.
//   - With the calibrated cuts, SparseFfn runs exactly the neurons the reference selects from
//     the same h: per layer, the up rows (relu(gate) >= the expert's gate cut) and the down rows
//     (|relu(gate) * up| >= its coefficient cut).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/kernels/matmul.h"
#include "shared/model/model.h"
#include "shared/model/synth.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/profiler.h"
#include "shared/sparsity/sparse_ffn.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

std::unique_ptr<Model> SynthMoe(const std::string& arch) {
  SynthOptions o;
  o.arch = arch;
  o.dim = 64;
  o.ffn = 96;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 300;
  o.context = 64;
  o.experts = 4;
  o.ffn_kind = SynthFfnKind::kReluGated;
  o.active_fraction = 0;  // i.i.d. weights: about half of an expert's neurons fire
  o.seed = 23;
  const std::string path = testing::TempDir() + "/moe_threshold_" + arch + ".gguf";
  const absl::Status s = WriteSynthModel(o, path);
  EXPECT_TRUE(s.ok()) << s;
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// A prompt batch, then single-token steps (the one-token path).
std::vector<float> Logits(const Model& model, ThreadPool& pool, FfnExecutor* ffn) {
  auto kv = KvCache::Create(model.config(), 1, 32, GgmlType::kF32);
  EXPECT_TRUE(kv.ok());
  ForwardPass pass(model, *kv, pool, ffn);
  std::vector<BatchEntry> batch;
  for (int32_t p = 0; p < 16; ++p) batch.push_back({0, p, (p * 53 + 7) % 300, true});
  std::vector<float> logits;
  EXPECT_TRUE(pass.Run(batch, logits).ok());
  for (int32_t p = 16; p < 20; ++p) {
    BatchEntry e{0, p, (p * 31) % 300, true};
    std::vector<float> row;
    EXPECT_TRUE(pass.Run({&e, 1}, row).ok());
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

// For every row an FFN executor is given, each routed (token, expert) pair's gate and up
// products, computed here from the expert's rows; then the wrapped executor runs as usual.
class ExpertRows final : public FfnExecutor {
 public:
  ExpertRows(const Model& model, FfnExecutor& inner, ThreadPool& pool)
      : model_(model), inner_(inner), pool_(pool) {}
  using FfnExecutor::Compute;
  void Compute(int64_t layer, const float* h, const float* predictor_input, int64_t n_tokens,
               float* out) override {
    const ModelConfig& c = model_.config();
    if (c.layers[layer].moe) {
      const LayerWeights& w = model_.layer(layer);
      RouteExperts(c, w, h, n_tokens, pool_, probs_, picks_, weights_);
      std::vector<float> gate(c.ffn_dim), up(c.ffn_dim);
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t j = 0; j < c.n_experts_used; ++j) {
          const int32_t e = picks_[t * c.n_experts_used + j];
          MatMul(w.experts[e].gate, h + t * c.dim, 1, c.dim, gate.data(), c.ffn_dim, pool_);
          MatMul(w.experts[e].up, h + t * c.dim, 1, c.dim, up.data(), c.ffn_dim, pool_);
          on_row(layer, e, gate, up);
        }
      }
    }
    inner_.Compute(layer, h, predictor_input, n_tokens, out);
  }
  std::function<void(int64_t layer, int32_t expert, const std::vector<float>& gate,
                     const std::vector<float>& up)>
      on_row;

 private:
  const Model& model_;
  FfnExecutor& inner_;
  ThreadPool& pool_;
  std::vector<float> probs_, weights_;
  std::vector<int32_t> picks_;
};

class MoeThresholdTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeThresholdTest, ZeroCutsEqualExact) {
  auto model = SynthMoe(GetParam());
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  ASSERT_TRUE(c.moe());
  ThreadPool pool(2);
  auto exact = SparseFfn::Create(*model, SparsityPlan::Uniform(SparsityMode::kExact, c.n_layers),
                                 pool);
  ASSERT_TRUE(exact.ok()) << exact.status();
  SparsityPlan zero = SparsityPlan::Uniform(SparsityMode::kThreshold, c.n_layers);
  zero.expert_cuts.assign(c.n_layers, std::vector<float>(c.n_experts, 0.0f));
  zero.expert_coeff_cuts = zero.expert_cuts;
  auto threshold = SparseFfn::Create(*model, zero, pool);
  ASSERT_TRUE(threshold.ok()) << threshold.status();
  const std::vector<float> want = Logits(*model, pool, exact->get());
  const std::vector<float> got = Logits(*model, pool, threshold->get());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ((*threshold)->activity()[l].active, (*exact)->activity()[l].active);
    EXPECT_LT((*exact)->activity()[l].active, (*exact)->activity()[l].candidates);
  }

  // Without per-expert cuts threshold is refused naming the layer; predicted always.
  SparsityPlan missing = SparsityPlan::Uniform(SparsityMode::kThreshold, c.n_layers);
  auto refused = SparseFfn::Create(*model, missing, pool);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "layer 0 is a mixture-of-experts layer: mode 'threshold' needs each expert's cuts"),
            std::string::npos)
      << refused.status();
  SparsityPlan negative = zero;
  negative.expert_coeff_cuts[1][2] = -1;
  refused = SparseFfn::Create(*model, negative, pool);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("layer 1 expert 2: cut -1"), std::string::npos)
      << refused.status();
  refused = SparseFfn::Create(*model, SparsityPlan::Uniform(SparsityMode::kPredicted, c.n_layers),
                              pool);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("needs one predictor per expert"), std::string::npos)
      << refused.status();
  // The command-line path says so before asking for a predictor file.
  SparsityFlags flags;
  flags.mode = "predicted";
  auto from_flags = SparsityPlanFromFlags(*model, flags);
  ASSERT_FALSE(from_flags.ok());
  EXPECT_NE(from_flags.status().message().find("layer 0 is a mixture-of-experts layer"),
            std::string::npos)
      << from_flags.status();
}

TEST_P(MoeThresholdTest, CalibratedPerExpertAndSelectsTheReferenceSet) {
  auto model = SynthMoe(GetParam());
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  ThreadPool pool(2);
  auto tokens = TokenizeCorpusFile(
      testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt", model->tokenizer(), 1500);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ProfileOptions po;
  po.window = 64;
  po.batch = 64;
  auto profile = ProfileActivations(*model, *tokens, po, pool);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const ActivationStats& stats = profile->stats;
  ASSERT_EQ(stats.n_experts, c.n_experts);
  // The stats survive the file format.
  const std::string stats_path = testing::TempDir() + "/moe_threshold_stats_" + GetParam() + ".gguf";
  ASSERT_TRUE(WriteActivationStats(stats, stats_path).ok());
  auto back = ReadActivationStats(stats_path, &c);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layers[1].frequency, stats.layers[1].frequency);
  EXPECT_EQ(back->layers[1].coeff_cuts, stats.layers[1].coeff_cuts);

  // The reference: the same corpus windows through the dense pass, each routed row's values.
  const int64_t F = c.ffn_dim, E = c.n_experts;
  std::vector<std::vector<int64_t>> rows(c.n_layers, std::vector<int64_t>(E, 0));
  std::vector<std::vector<int64_t>> positive(c.n_layers, std::vector<int64_t>(E * F, 0));
  std::vector<std::vector<std::vector<float>>> act(c.n_layers, std::vector<std::vector<float>>(E));
  std::vector<std::vector<std::vector<float>>> coeff = act;
  {
    DenseFfn dense(*model, pool);
    ExpertRows rec(*model, dense, pool);
    rec.on_row = [&](int64_t l, int32_t e, const std::vector<float>& g, const std::vector<float>& u) {
      ++rows[l][e];
      for (int64_t i = 0; i < F; ++i) {
        const float a = g[i] > 0.0f ? g[i] : 0.0f;
        positive[l][e * F + i] += g[i] > 0.0f;
        act[l][e].push_back(a);
        coeff[l][e].push_back(std::fabs(a * u[i]));
      }
    };
    auto kv = KvCache::Create(c, 1, po.window, GgmlType::kF32);
    ASSERT_TRUE(kv.ok());
    ForwardPass pass(*model, *kv, pool, &rec);
    CorpusWindowOptions wo;
    wo.window = po.window;
    wo.batch = po.batch;
    wo.want_logits = false;
    ASSERT_TRUE(RunCorpusWindows(pass, *tokens, wo, [](auto, auto) {}).ok());
  }
  auto share_below = [](const std::vector<float>& v, float cut) {
    return static_cast<double>(std::count_if(v.begin(), v.end(), [&](float x) { return x < cut; })) /
           static_cast<double>(v.size());
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerActivationStats& L = stats.layers[l];
    ASSERT_EQ(L.experts, E);
    ASSERT_EQ(L.frequency.size(), static_cast<size_t>(E * F));
    for (int64_t e = 0; e < E; ++e) {
      SCOPED_TRACE(::testing::Message() << "layer " << l << " expert " << e);
      ASSERT_GT(rows[l][e], 100);  // every expert is routed enough rows to calibrate
      EXPECT_EQ(L.expert_share[e], static_cast<float>(static_cast<double>(rows[l][e]) /
                                                      static_cast<double>(stats.tokens)));
      for (int64_t i = 0; i < F; ++i) {
        ASSERT_EQ(L.frequency[e * F + i],
                  static_cast<float>(static_cast<double>(positive[l][e * F + i]) /
                                     static_cast<double>(rows[l][e])));
      }
      // The cut splits the expert's own values at the target (to within one histogram bin).
      for (float t : {0.7f, 0.8f}) {
        auto cut = stats.CutFor(l, t, e);
        auto coeff_cut = stats.CoeffCutFor(l, t, e);
        ASSERT_TRUE(cut.ok() && coeff_cut.ok());
        EXPECT_NEAR(share_below(act[l][e], *cut), t, 0.01);
        EXPECT_NEAR(share_below(coeff[l][e], *coeff_cut), t, 0.01);
      }
    }
    // The experts differ, so one cut per layer would not do: their 0.8 cuts are not all equal.
    EXPECT_NE(*stats.CoeffCutFor(l, 0.8f, 0), *stats.CoeffCutFor(l, 0.8f, 1));
  }

  // The plan takes each expert's cuts: coefficient at 0.8, gate at 0.7.
  auto plan = SparsityPlan::ForModel(c, SparsityMode::kThreshold, &*back, 0.8f, nullptr, 0.7f);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(plan->expert_cuts[l][e], *stats.CutFor(l, 0.7f, e));
      EXPECT_EQ(plan->expert_coeff_cuts[l][e], *stats.CoeffCutFor(l, 0.8f, e));
    }
  }
  auto sparse = SparseFfn::Create(*model, *plan, pool);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  std::vector<int64_t> want_up(c.n_layers, 0), want_down(c.n_layers, 0), candidates(c.n_layers, 0);
  ExpertRows rec(*model, **sparse, pool);
  rec.on_row = [&](int64_t l, int32_t e, const std::vector<float>& g, const std::vector<float>& u) {
    const float cut = std::max(plan->expert_cuts[l][e], std::numeric_limits<float>::denorm_min());
    for (int64_t i = 0; i < F; ++i) {
      const float a = g[i] > 0.0f ? g[i] : 0.0f;
      ++candidates[l];
      if (!(a >= cut)) continue;
      ++want_up[l];
      want_down[l] += std::fabs(a * u[i]) >= plan->expert_coeff_cuts[l][e];
    }
  };
  (void)Logits(*model, pool, &rec);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerActivity& a = (*sparse)->activity()[l];
    std::printf("%s layer %lld: %lld candidates, %lld up rows, %lld down rows\n",
                GetParam().c_str(), static_cast<long long>(l), static_cast<long long>(candidates[l]),
                static_cast<long long>(a.active), static_cast<long long>(a.down));
    EXPECT_EQ(a.candidates, candidates[l]);
    EXPECT_EQ(a.active, want_up[l]);
    EXPECT_EQ(a.down, want_down[l]);
    // Non-trivial: the gate cut drops more than ReLU's zeros, the coefficient cut more still.
    EXPECT_LT(a.active, candidates[l] * 4 / 10);
    EXPECT_LT(a.down, a.active);
    EXPECT_GT(a.down, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, MoeThresholdTest, ::testing::Values("llama", "qwen2moe"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace thermocline
