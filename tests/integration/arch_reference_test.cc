// Every architecture against llama.cpp's own logits (../shared/models/archs/, README there):
// the 32-position prompt batch, the 16 greedy picks and the logits behind each of them (the
// KV-cache path, one token per step), dense in this process and split over the two worker
// processes at hot fractions 0, 0.5 and 1.
//
// Bounds. The models are tiny (dim 64) fp32 models, so for the architectures without GELU the
// only difference from llama.cpp is the order of fp32 sums: each logit passes through a few
// hundred roundings of relative size 2^-24 that partly cancel; llama.cpp's own float64 check
// (np_check.txt) sits at 2e-7..7e-7 of max|logit|. We allow 1e-5 of max(1, max|logit|)
// (measured: <= 7.2e-7). GELU models go through ggml's fp16 GELU table (ops.h Gelu), emulated
// here: an input that lands within an fp32 rounding of an fp16 rounding boundary takes the
// neighbouring table entry, one fp16 step (2^-11 relative) of one activation. The README's float64
// emulation shows the same flips (falcon 2.7e-5, starcoder2 2.9e-4, gemma2 9.7e-4 of max|logit|,
// gemma2 through 26 layers), so GELU models get 2e-3 of max|logit| (measured: falcon 1.6e-5,
// starcoder2 1.3e-4, gemma2 5.2e-4). Greedy picks must be llama.cpp's exactly: the smallest
// top-2 gap in these files (0.0001, llama-rope-linear) is above both bounds' absolute size at
// that model's logit scale.
//
// In the MoE models (llama-moe, qwen2moe) the split puts each expert's neurons hot or cold; the
// cpu worker's metrics must show it computed the cold share of every chosen expert of every
// MoE layer for every row (and nothing at hot 1).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/driver/split_engine.h"
#include "shared/ipc/segment.h"
#include "shared/ipc/worker_metrics.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "tests/arch_references.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::ArchCase;
using testing::ArchPath;
using testing::Ints;
using testing::kArchCases;
using testing::kGreedy;
using testing::kVocab;
using testing::ReferenceGreedy;
using testing::RunGreedy;
using testing::RunOutput;

double Bound(const ArchCase& c, const float* ref, int64_t n) {
  double m = 1.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::abs(ref[i])));
  return (c.gelu ? 2e-3 : 1e-5) * m;
}

// max |a - b| over rows, checked row by row against the row's bound.
void ExpectClose(const ArchCase& c, const std::vector<float>& got, const std::vector<float>& ref,
                 int64_t rows, const char* what) {
  ASSERT_EQ(got.size(), static_cast<size_t>(rows * kVocab)) << what;
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = got.data() + r * kVocab;
    const float* b = ref.data() + r * kVocab;
    const double bound = Bound(c, b, kVocab);
    double d = 0;
    for (int64_t i = 0; i < kVocab; ++i) d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
    worst = std::max(worst, d / bound);
    ASSERT_LE(d, bound) << what << ": row " << r;
  }
  std::printf("%s %s: worst row at %.3f of its bound\n", c.name, what, worst);
}

class ArchReferenceTest : public ::testing::TestWithParam<ArchCase> {};

TEST_P(ArchReferenceTest, DenseMatchesLlamaCpp) {
  const ArchCase& c = GetParam();
  auto model = Model::Load(ArchPath(std::string(c.name) + ".gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> ids = Ints(testing::ReadFileOrDie(ArchPath("ids32.txt")));
  ASSERT_EQ(ids.size(), 32u);
  const std::vector<float> ref = testing::ReadF32File(ArchPath(std::string(c.name) + ".logits.f32"));
  const std::vector<float> ref_steps =
      testing::ReadF32File(ArchPath(std::string(c.name) + ".greedy_steps.f32"));
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    auto kv = KvCache::Create((*model)->config(), 1, 64, GgmlType::kF32);
    ASSERT_TRUE(kv.ok()) << kv.status();
    ForwardPass pass(**model, *kv, pool);
    ForwardPassRunner runner(pass);
    const RunOutput out = RunGreedy(runner, ids);
    ExpectClose(c, out.prompt, ref, 32, "prompt logits");
    ExpectClose(c, out.steps, ref_steps, kGreedy, "greedy-step logits");
    EXPECT_EQ(out.greedy, ReferenceGreedy(c.name));
  }
}

TEST_P(ArchReferenceTest, SplitMatchesLlamaCpp) {
  const ArchCase& c = GetParam();
  const std::string path = ArchPath(std::string(c.name) + ".gguf");
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> ids = Ints(testing::ReadFileOrDie(ArchPath("ids32.txt")));
  const std::vector<float> ref = testing::ReadF32File(ArchPath(std::string(c.name) + ".logits.f32"));
  const std::vector<float> ref_steps =
      testing::ReadF32File(ArchPath(std::string(c.name) + ".greedy_steps.f32"));
  const ModelConfig& config = (*model)->config();
  static int counter = 0;
  for (double hot : {0.0, 0.5, 1.0}) {
    SCOPED_TRACE(hot);
    driver::SplitEngineOptions o = testing::ArchSplitOptions(
        path, config, hot, "archref-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    {
      // Created before the workers start, so they report from their first activation.
      auto metrics = ipc::WorkerMetricsRegion::Create(o.instance);
      ASSERT_TRUE(metrics.ok()) << metrics.status();
      auto engine = driver::SplitEngine::Create(o);
      ASSERT_TRUE(engine.ok()) << engine.status();
      const RunOutput out = RunGreedy(**engine, ids);
      ExpectClose(c, out.prompt, ref, 32, "split prompt logits");
      ExpectClose(c, out.steps, ref_steps, kGreedy, "split greedy-step logits");
      EXPECT_EQ(out.greedy, ReferenceGreedy(c.name));
      EXPECT_EQ((*engine)->stats().restarts, 0);
      if (config.moe()) {
        // Dense mode: every cold candidate runs. Each row sends one Activation per layer with
        // cold neurons and computes the cold share of each of its n_experts_used experts.
        const int64_t cold_per_expert = config.ffn_dim - std::llround(hot * config.ffn_dim);
        const int64_t rows = static_cast<int64_t>(ids.size()) + kGreedy - 1;
        const int64_t steps = kGreedy;
        int64_t moe_layers = 0;
        for (const LayerConfig& l : config.layers) moe_layers += l.moe ? 1 : 0;
        ASSERT_EQ(moe_layers, config.n_layers);  // both reference models are MoE throughout
        auto cpu = (*metrics)->Read(ipc::Role::kCpuWorker);
        ASSERT_TRUE(cpu.ok()) << cpu.status();
        const uint64_t expected_active =
            static_cast<uint64_t>(rows * moe_layers * config.n_experts_used * cold_per_expert);
        EXPECT_EQ(cpu->activations, static_cast<uint64_t>(cold_per_expert > 0 ? steps * moe_layers : 0));
        EXPECT_EQ(cpu->active_neurons, expected_active);
        EXPECT_EQ(cpu->candidate_neurons, expected_active);
        EXPECT_EQ(cpu->capacity_neurons,
                  static_cast<uint64_t>(cold_per_expert > 0 ? rows * moe_layers * config.n_experts *
                                                                  cold_per_expert
                                                            : 0));
      }
    }
    EXPECT_TRUE(ipc::ListInstanceSegments(o.instance).empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchReferenceTest, ::testing::ValuesIn(kArchCases),
                         testing::ArchCaseName);

}  // namespace
}  // namespace thermocline
