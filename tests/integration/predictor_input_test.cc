// PowerInfer's predictors read ffn_inp (the residual stream before ffn_norm) in the llama family
// (docs/formats.md). On a PowerInfer-format file (`synth --powerinfer`, whose analytic
// predictors are built for that input), predicted mode must select exactly the neurons a
// reference computed here from the stored fc1/fc2 tensors selects on ffn_inp:
//   - the predictor input the forward pass hands the FFN is the pre-norm residual: its RMSNorm
//     with the layer's ffn_norm weights is, bit for bit, the FFN input h;
//   - the set PredictorSet::Predict returns equals the double-precision reference
//     fc2 . relu(fc1 . x) >= threshold, except where a score is within float rounding of the
//     threshold;
//   - SparseFfn's candidate count per layer is the total of those sets.
// And a predictor file from an older Thermocline (trained on ffn_norm(x), no input key) is
// refused with a message saying to retrain.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/gguf/quant.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/ops.h"
#include "shared/sparsity/predictor.h"
#include "shared/sparsity/sparse_ffn.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::BinDir;
using testing::RunCommand;

constexpr int kLayers = 3;

std::string SynthPowerInfer() {
  const std::string dir = testing::TempDir();
  const std::string base = dir + "/pred-input.gguf";
  const testing::CommandResult r =
      RunCommand({BinDir() + "/thermocline", "synth", "-o", base, "--powerinfer", "--ffn-kind",
                  "relu-gated", "--dim", "128", "--ffn", "512", "--layers", std::to_string(kLayers),
                  "--heads", "4", "--kv-heads", "2", "--vocab", "512", "--context", "64",
                  "--seed", "5"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return dir + "/pred-input.powerinfer.gguf";
}

std::vector<double> Rows(const GgufTensorInfo& t) {
  const int64_t ne0 = t.ne[0], rows = t.n_elements / ne0;
  std::vector<float> f(static_cast<size_t>(t.n_elements));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(t.type, t.data + r * RowBytes(t.type, ne0), f.data() + r * ne0, ne0);
  }
  return std::vector<double>(f.begin(), f.end());
}

// Delegates to `inner` and keeps a copy of what every layer was given.
class RecordingFfn final : public FfnExecutor {
 public:
  explicit RecordingFfn(FfnExecutor& inner, int64_t dim) : inner_(inner), dim_(dim) {}
  using FfnExecutor::Compute;
  void Compute(int64_t layer, const float* h, const float* predictor_input, int64_t n_tokens,
               float* out) override {
    calls.push_back({layer, std::vector<float>(h, h + n_tokens * dim_),
                     std::vector<float>(predictor_input, predictor_input + n_tokens * dim_)});
    inner_.Compute(layer, h, predictor_input, n_tokens, out);
  }
  struct Call {
    int64_t layer;
    std::vector<float> h, x;
  };
  std::vector<Call> calls;

 private:
  FfnExecutor& inner_;
  int64_t dim_;
};

TEST(PredictorInputTest, PredictedModeSelectsTheNeuronsOfFfnInp) {
  const std::string path = SynthPowerInfer();
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  ASSERT_EQ(c.arch->predictor_input, PredictorInput::kFfnInput);
  auto plan = SparsityPlanFromFlags(**model, SparsityFlags{.mode = "predicted"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ThreadPool pool(1);
  auto sparse = SparseFfn::Create(**model, *plan, pool);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  RecordingFfn recorder(**sparse, c.dim);
  auto kv = KvCache::Create(c, 1, 32, GgmlType::kF32);
  ASSERT_TRUE(kv.ok());
  ForwardPass pass(**model, *kv, pool, &recorder);
  std::vector<BatchEntry> batch;
  for (int32_t p = 0; p < 12; ++p) batch.push_back({0, p, (p * 37 + 5) % 512, p == 11});
  std::vector<float> logits;
  ASSERT_TRUE(pass.Run(batch, logits).ok());
  ASSERT_EQ(recorder.calls.size(), static_cast<size_t>(kLayers));

  const PredictorSet& predictors = *plan->predictors;
  const GgufFile& f = (*model)->file();
  int64_t compared = 0;
  for (const RecordingFfn::Call& call : recorder.calls) {
    const int64_t l = call.layer;
    SCOPED_TRACE(l);
    const LayerWeights& w = (*model)->layer(l);
    const int64_t n = static_cast<int64_t>(call.x.size()) / c.dim;
    // 1. The predictor input is the pre-norm residual: ffn_norm of it is exactly h.
    std::vector<float> normed(c.dim);
    for (int64_t t = 0; t < n; ++t) {
      RmsNorm(call.x.data() + t * c.dim, w.ffn_norm.data(), c.dim, c.rms_eps, normed.data());
      for (int64_t i = 0; i < c.dim; ++i) ASSERT_EQ(normed[i], call.h[t * c.dim + i]) << t << " " << i;
    }
    // 2. The selection equals the reference over the stored tensors.
    const GgufTensorInfo* fc1 = f.FindTensor("blk." + std::to_string(l) + ".fc1.weight");
    const GgufTensorInfo* fc2 = f.FindTensor("blk." + std::to_string(l) + ".fc2.weight");
    ASSERT_NE(fc1, nullptr);
    ASSERT_NE(fc2, nullptr);
    const std::vector<double> w1 = Rows(*fc1), w2 = Rows(*fc2);
    const int64_t rank = fc1->ne[1];
    const double t_cut = predictors.layer_threshold(l);
    int64_t reference_total = 0, near_threshold = 0;
    std::vector<int32_t> got;
    for (int64_t t = 0; t < n; ++t) {
      const float* x = call.x.data() + t * c.dim;
      std::vector<double> mid(rank);
      for (int64_t r = 0; r < rank; ++r) {
        double s = 0;
        for (int64_t i = 0; i < c.dim; ++i) s += w1[r * c.dim + i] * x[i];
        mid[r] = std::max(0.0, s);
      }
      predictors.Predict(l, x, &got, pool);
      std::vector<bool> picked(c.ffn_dim);
      for (int32_t id : got) picked[id] = true;
      int64_t mismatches = 0;
      for (int64_t j = 0; j < c.ffn_dim; ++j) {
        double s = 0, scale = 0;
        for (int64_t r = 0; r < rank; ++r) {
          s += w2[j * rank + r] * mid[r];
          scale += std::abs(w2[j * rank + r] * mid[r]);
        }
        const bool ref = s >= t_cut;
        // fp32 sums of `rank` terms can land on the other side of the threshold only this close.
        const bool ambiguous = std::abs(s - t_cut) < 1e-5 * (scale + 1e-30);
        reference_total += ref;
        near_threshold += ambiguous;
        if (picked[j] != ref && !ambiguous) ++mismatches;
        ++compared;
      }
      EXPECT_EQ(mismatches, 0) << "token " << t;
    }
    // 3. What SparseFfn ran as candidates is the predictor's selection on x.
    EXPECT_NEAR(static_cast<double>((*sparse)->activity()[l].candidates),
                static_cast<double>(reference_total), static_cast<double>(near_threshold) + 0.5);
    EXPECT_GT(reference_total, 0);
    EXPECT_LT(reference_total, n * c.ffn_dim / 2);  // the predictors are selective
  }
  EXPECT_GT(compared, 0);
}

TEST(PredictorInputTest, OldThermoclinePredictorFilesAreRefused) {
  const std::string path = SynthPowerInfer();
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  auto plan = SparsityPlanFromFlags(**model, SparsityFlags{.mode = "predicted"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // A file as train-predictor writes it now carries the input key and loads back.
  const std::string good = testing::TempDir() + "/pred-input-new.gguf";
  ASSERT_TRUE(WritePredictors(*plan->predictors, (*model)->config(), good).ok());
  auto loaded = PredictorSet::Load(good, (*model)->config());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // The same file without the key, as Thermocline wrote it before: refused, saying to retrain.
  auto file = GgufFile::Open(good);
  ASSERT_TRUE(file.ok());
  GgufWriter w;
  for (const auto& [key, value] : (*file)->metadata()) {
    if (key != "thermocline.predictor.input") w.SetValue(key, value);
  }
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    const std::string_view bytes(reinterpret_cast<const char*>(t.data),
                                 static_cast<size_t>(t.n_bytes));
    ASSERT_TRUE(w.AddTensorBytes(t.name, t.type, t.ne, bytes).ok());
  }
  const std::string old = testing::TempDir() + "/pred-input-old.gguf";
  ASSERT_TRUE(w.WriteFile(old).ok());
  auto refused = PredictorSet::Load(old, (*model)->config());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("ffn_norm(x)"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("retrain"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace thermocline
