// `exact` equals `dense` on a ReLU-family model of every FFN shape the architecture layer has:
// gated ReLU (llama), gated with up biases and dReLU (bamboo), plain ReLU MLPs with and without
// biases and a parallel block (starcoder2, falcon), and fused [gate|up] (phi3). Exact skips only
// neurons whose activation is exactly 0, so the only difference from dense is the order of the
// down projection's sum: fp32 reassociation over ffn_dim terms, bounded by 1e-5 of
// max(1, max|logit|) for these small fp32 models (the same argument as sparse_ffn_test's
// ExactSparsityTest). MoE layers run exact inside each chosen expert; threshold there needs each
// expert's cuts (moe_threshold_test) and a plan with per-layer cuts only is refused by name.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/model/synth.h"
#include "shared/runtime/forward.h"
#include "shared/sparsity/sparse_ffn.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

struct ShapeCase {
  const char* arch;
  SynthFfnKind kind;
};

std::unique_ptr<Model> Synth(const ShapeCase& c, int64_t experts = 0) {
  SynthOptions o;
  o.arch = c.arch;
  o.dim = 128;
  o.ffn = 256;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.context = 64;
  o.ffn_kind = c.kind;
  o.active_fraction = 0;  // i.i.d. weights: about half the neurons fire
  o.experts = experts;
  o.seed = 9;
  const std::string path = testing::TempDir() + "/" + c.arch + ".gguf";
  const absl::Status s = WriteSynthModel(o, path);
  EXPECT_TRUE(s.ok()) << s;
  auto model = Model::Load(path);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

std::vector<float> Logits(const Model& model, ThreadPool& pool, FfnExecutor* ffn) {
  auto kv = KvCache::Create(model.config(), 1, 32, GgmlType::kF32);
  EXPECT_TRUE(kv.ok());
  ForwardPass pass(model, *kv, pool, ffn);
  std::vector<BatchEntry> batch;
  for (int32_t p = 0; p < 16; ++p) batch.push_back({0, p, (p * 53 + 7) % 512, true});
  std::vector<float> logits;
  EXPECT_TRUE(pass.Run(batch, logits).ok());
  // Then single-token steps: the one-token sparse path.
  for (int32_t p = 16; p < 20; ++p) {
    BatchEntry e{0, p, (p * 31) % 512, true};
    std::vector<float> step;
    EXPECT_TRUE(pass.Run({&e, 1}, step).ok());
    logits.insert(logits.end(), step.begin(), step.end());
  }
  return logits;
}

// max |a - b| and max(1, max |b|).
std::pair<double, double> MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, max_ref = 1;
  for (size_t i = 0; i < b.size(); ++i) {
    max_ref = std::max(max_ref, static_cast<double>(std::abs(b[i])));
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return {worst, max_ref};
}

class FfnShapesExactTest : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(FfnShapesExactTest, ExactEqualsDense) {
  const ShapeCase& c = GetParam();
  std::unique_ptr<Model> model = Synth(c);
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(IsReluFamily(model->config().activation));
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    const std::vector<float> dense = Logits(*model, pool, nullptr);
    auto exact = SparseFfn::Create(
        *model, SparsityPlan::Uniform(SparsityMode::kExact, model->config().n_layers), pool);
    ASSERT_TRUE(exact.ok()) << exact.status();
    const std::vector<float> got = Logits(*model, pool, exact->get());
    ASSERT_EQ(got.size(), dense.size());
    const auto [worst, max_ref] = MaxDiff(got, dense);
    const double active = (*exact)->ActiveRatio();
    std::printf("%s: max |exact - dense| %.3g (bound %.3g), active %.3f\n", c.arch, worst,
                1e-5 * max_ref, active);
    EXPECT_LE(worst, 1e-5 * max_ref);
    EXPECT_GT(active, 0.05);  // it computes something...
    EXPECT_LT(active, 0.9);   // ...and skips the zeros
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FfnShapesExactTest,
                         ::testing::Values(ShapeCase{"llama", SynthFfnKind::kReluGated},
                                           ShapeCase{"bamboo", SynthFfnKind::kDrelu},
                                           ShapeCase{"qwen2", SynthFfnKind::kReluGated},
                                           ShapeCase{"phi3", SynthFfnKind::kReluGated},
                                           ShapeCase{"starcoder2", SynthFfnKind::kReluGated},
                                           ShapeCase{"falcon", SynthFfnKind::kReluGated}),
                         [](const ::testing::TestParamInfo<ShapeCase>& info) {
                           return std::string(info.param.arch);
                         });

// MoE: exact inside each chosen expert (and the shared expert) equals the dense experts.
TEST(FfnShapesExactTest, MoeExactEqualsDenseInsideTheChosenExperts) {
  for (const char* arch : {"llama", "qwen2moe"}) {
    SCOPED_TRACE(arch);
    std::unique_ptr<Model> model = Synth(ShapeCase{arch, SynthFfnKind::kReluGated}, 4);
    ASSERT_NE(model, nullptr);
    ASSERT_TRUE(model->config().moe());
    ThreadPool pool(2);
    const std::vector<float> dense = Logits(*model, pool, nullptr);
    auto exact = SparseFfn::Create(
        *model, SparsityPlan::Uniform(SparsityMode::kExact, model->config().n_layers), pool);
    ASSERT_TRUE(exact.ok()) << exact.status();
    const std::vector<float> got = Logits(*model, pool, exact->get());
    ASSERT_EQ(got.size(), dense.size());
    const auto [worst, max_ref] = MaxDiff(got, dense);
    int64_t candidates = 0, active = 0;
    for (const LayerActivity& a : (*exact)->activity()) {
      candidates += a.candidates;
      active += a.active;
    }
    std::printf("%s MoE: max |exact - dense| %.3g (bound %.3g), active %lld of %lld candidates\n",
                arch, worst, 1e-5 * max_ref, static_cast<long long>(active),
                static_cast<long long>(candidates));
    EXPECT_LE(worst, 1e-5 * max_ref);
    EXPECT_GT(active, candidates / 20);
    EXPECT_LT(active, candidates * 9 / 10);
    // Threshold with per-layer cuts only (no per-expert ones) is refused by name.
    SparsityPlan threshold = SparsityPlan::Uniform(SparsityMode::kThreshold, model->config().n_layers);
    std::fill(threshold.coeff_cuts.begin(), threshold.coeff_cuts.end(), 0.1f);
    auto refused = SparseFfn::Create(*model, threshold, pool);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("mixture-of-experts"), std::string::npos)
        << refused.status();
  }
}

}  // namespace
}  // namespace thermocline
