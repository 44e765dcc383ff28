// llama.cpp's references on the cuda backend, through the real worker processes (`--backend
// cuda`, the cold neurons on the cpu worker): the layer program (shared/runtime/layer_program.h)
// executed by the device for every architecture, and the hot FFN reading every quantized type
// as the file stores it. Without a CUDA device every test skips with the reason.
//
// ---- CudaArchTest: ../shared/models/archs/, hot fractions 0, 0.5 and 1, against llama.cpp's
// logits; in the MoE models (llama-moe, qwen2moe) each expert's neurons are split hot / cold and
// qwen2moe's shared expert stays on the device.
//
// Bounds. The device rounds the input of every dense product (q, k, v, o, the output head, and
// the hot FFN's h stays fp32) and the weights of those products to fp16: each product moves by
// up to 2^-10 of sum |w x|, against the CPU's fp32 (the CPU test's bound is 1e-5). Through
// the layers (at most 26, gemma2) these add like a random walk of ~5 products per layer, about
// sqrt(131) * 2^-10 ~ 1.1e-2 of the logits' scale for the deepest model if nothing cancels; we
// allow 3e-2 of max(1, max|logit|) per row. Greedy picks are compared for as long as the
// reference's top-2 gap stays above twice that bound (a smaller gap may flip legitimately, and
// every later step then follows another sequence).
//
// ---- CudaQuantTest: llama.cpp's quantized files of ../shared/models/quants/ (README there: one
// 4-layer model, n_embd 256, in every type and mix llama-quantize makes), through the real worker
// processes at hot fractions 0.5 and 1, against the logits of the same weights dequantized to f32
// (X.deqf32.logits.f32): the hot FFN reads each file's own blocks (block_decode.h, K-quants and
// IQ4 included, Q4_K_M's q4_K gate/up beside q6_K down), the dense products their fp16 copies.
//
// Bound. The device keeps the FFN's activations in fp32 over exactly the dequantized weights, so
// against the f32 reference only the dense products' fp16 inputs and weights remain (2^-10 of
// sum |w x| per product, ~5 products per layer and the head): sqrt(21) * 2^-10 ~ 4.5e-3 of the
// logits' scale if nothing cancels; we allow 2e-2 of max(1, max|logit|) per row.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_worker/cuda/cuda_backend.h"
#include "shared/driver/split_engine.h"
#include "shared/model/model.h"
#include "tests/arch_references.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::ArchCase;
using testing::ArchPath;
using testing::kGreedy;
using testing::kVocab;

constexpr double kRelBound = 3e-2;

double RowBound(const float* ref) {
  double m = 1.0;
  for (int64_t i = 0; i < kVocab; ++i) m = std::max(m, static_cast<double>(std::abs(ref[i])));
  return kRelBound * m;
}

double TopTwoGap(const float* x) {
  std::vector<float> v(x, x + kVocab);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return static_cast<double>(v[0]) - v[1];
}

class CudaArchTest : public ::testing::TestWithParam<ArchCase> {
 protected:
  void SetUp() override {
    const absl::Status s = gpu_worker::CudaAvailable();
    if (!s.ok()) GTEST_SKIP() << "no CUDA device: " << s.message();
  }
};

TEST_P(CudaArchTest, SplitOnTheDeviceMatchesLlamaCpp) {
  const ArchCase& c = GetParam();
  const std::string path = ArchPath(std::string(c.name) + ".gguf");
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& config = (*model)->config();
  const std::vector<int32_t> ids = testing::Ints(testing::ReadFileOrDie(ArchPath("ids32.txt")));
  const std::vector<float> ref =
      testing::ReadF32File(ArchPath(std::string(c.name) + ".logits.f32"));
  const std::vector<float> ref_steps =
      testing::ReadF32File(ArchPath(std::string(c.name) + ".greedy_steps.f32"));
  const std::vector<int32_t> ref_greedy = testing::ReferenceGreedy(c.name);
  static int counter = 0;
  for (double hot : {0.0, 0.5, 1.0}) {
    SCOPED_TRACE(hot);
    driver::SplitEngineOptions o = testing::ArchSplitOptions(
        path, config, hot,
        "cudaarch-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    o.gpu_backend = "cuda";
    auto engine = driver::SplitEngine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const testing::RunOutput out = testing::RunGreedy(**engine, ids);
    ASSERT_EQ(out.prompt.size(), ids.size() * kVocab);
    double worst = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      const float* a = out.prompt.data() + r * kVocab;
      const float* b = ref.data() + r * kVocab;
      const double bound = RowBound(b);
      double d = 0;
      for (int64_t i = 0; i < kVocab; ++i)
        d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
      worst = std::max(worst, d / bound);
      EXPECT_LE(d, bound) << c.name << " prompt row " << r;
    }
    int agreed = 0;
    for (int s = 0; s < kGreedy && s < static_cast<int>(out.greedy.size()); ++s) {
      const float* b = ref_steps.data() + s * kVocab;
      if (TopTwoGap(b) <= 2 * RowBound(b)) break;
      ASSERT_EQ(out.greedy[s], ref_greedy[s]) << c.name << " greedy step " << s;
      ++agreed;
    }
    std::printf("%s hot %.1f: worst prompt row at %.3f of its bound; %d greedy picks compared\n",
                c.name, hot, worst, agreed);
    EXPECT_EQ((*engine)->stats().restarts, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaArchTest, ::testing::ValuesIn(testing::kArchCases),
                         testing::ArchCaseName);

constexpr double kQuantRelBound = 2e-2;

class CudaQuantTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const absl::Status s = gpu_worker::CudaAvailable();
    if (!s.ok()) GTEST_SKIP() << "no CUDA device: " << s.message();
  }
};

TEST_P(CudaQuantTest, SplitOnTheDeviceMatchesTheDequantizedReference) {
  const std::string name = GetParam();
  const std::string path = testing::ModelPath("quants/" + name + ".gguf");
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> ids =
      testing::Ints(testing::ReadFileOrDie(testing::ModelPath("quants/ids32.txt")));
  const std::vector<float> ref =
      testing::ReadF32File(testing::ModelPath("quants/" + name + ".deqf32.logits.f32"));
  static int counter = 0;
  for (double hot : {0.5, 1.0}) {
    SCOPED_TRACE(hot);
    driver::SplitEngineOptions o = testing::ArchSplitOptions(
        path, (*model)->config(), hot,
        "cudaquant-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    o.gpu_backend = "cuda";
    auto engine = driver::SplitEngine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<BatchEntry> batch;
    for (size_t p = 0; p < ids.size(); ++p)
      batch.push_back({0, static_cast<int32_t>(p), ids[p], true});
    std::vector<float> logits;
    ASSERT_TRUE((*engine)->Run(batch, logits).ok());
    ASSERT_EQ(logits.size(), ids.size() * kVocab);
    double worst = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      const float* a = logits.data() + r * kVocab;
      const float* b = ref.data() + r * kVocab;
      double m = 1.0, d = 0.0;
      for (int64_t i = 0; i < kVocab; ++i) {
        m = std::max(m, static_cast<double>(std::abs(b[i])));
        d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
      }
      worst = std::max(worst, d / (kQuantRelBound * m));
      EXPECT_LE(d, kQuantRelBound * m) << name << " row " << r;
    }
    std::printf("%s hot %.1f: worst row at %.3f of its bound\n", name.c_str(), hot, worst);
    EXPECT_EQ((*engine)->stats().restarts, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Quants, CudaQuantTest,
                         // One file per block type the FFN kernels decode (Q8_0 and Q4_0 are
                         // cuda_worker_test's), and Q4_K_M's mix; scripts/gpu-bundle.sh carries
                         // the same list to the device.
                         ::testing::Values("Q4_K_M", "pure-Q2_K", "pure-Q3_K", "pure-Q5_K",
                                           "pure-IQ4_NL", "pure-IQ4_XS"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace thermocline
