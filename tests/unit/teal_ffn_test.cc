// TealFfnPart (sparsity/teal_ffn.h), the split workers' TEAL FFN, against the single-process
// one (DenseFfn through TealLinear): a part holding every neuron gives its bits, for float and
// quantized weights, gate and up side by side or apart, gated and plain MLPs with biases; two
// parts that split the neurons between them add up to it within the f32 bound of reordered
// sums; the cuts do drop inputs; bad shapes are refused.
#include "shared/sparsity/teal_ffn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/model/synth.h"
#include "shared/runtime/ffn.h"
#include "shared/sparsity/teal.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

std::unique_ptr<Model> SynthArch(GgmlType type, const std::string& arch, SynthFfnKind kind,
                                 const std::string& name) {
  SynthOptions o;
  o.arch = arch;
  o.dim = 64;
  o.ffn = 160;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = arch == "llama" ? 2 : 4;
  o.vocab = 300;
  o.context = 32;
  o.type = type;
  o.ffn_kind = kind;
  o.threads = 1;
  const std::string path = testing::TempDir() + "/" + name + ".gguf";
  EXPECT_TRUE(WriteSynthModel(o, path).ok());
  auto model = Model::Load(path);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

TealPlan FfnPlan(int64_t n_layers, const TealFfnCuts& cuts) {
  TealPlan plan = TealPlan::TopShare(n_layers, 0.0f);
  plan.kind = TealPlan::Kind::kCuts;
  for (ProjectionValues& v : plan.values) {
    v[static_cast<int>(Projection::kGate)] = cuts.gate;
    v[static_cast<int>(Projection::kUp)] = cuts.up;
    v[static_cast<int>(Projection::kDown)] = cuts.down;
  }
  return plan;
}

// One decode row of the layer's FFN as one process computes it under TEAL.
std::vector<float> Reference(const Model& model, int64_t layer, const TealFfnCuts& cuts,
                             const std::vector<float>& h, ThreadPool& pool) {
  auto teal = TealLinear::Create(model, FfnPlan(model.config().n_layers, cuts), pool);
  EXPECT_TRUE(teal.ok()) << teal.status();
  const uint8_t decode[] = {1};
  (*teal)->BeginBatch(decode);
  DenseFfn ffn(model, pool);
  ffn.set_linear(teal->get());
  std::vector<float> out(model.config().dim);
  ffn.Compute(layer, h.data(), 1, out.data());
  return out;
}

struct Part {
  TealFfnPart part;
  DownRows down;  // the down copy the part reads (kept alive)
};

// The part over neurons `ids` of the layer, read from the model's rows as the GPU worker does.
Part PartOf(const Model& model, int64_t layer, const std::vector<int32_t>& ids,
            const TealFfnCuts& cuts, ThreadPool& pool) {
  const LayerWeights& w = model.layer(layer);
  Part p;
  auto down = DownRows::ForLayer(model, layer, std::nullopt, pool);
  EXPECT_TRUE(down.ok()) << down.status();
  p.down = *std::move(down);
  std::vector<float> up_b;
  for (int32_t id : ids) {
    if (!w.up_b.empty()) up_b.push_back(w.up_b[id]);
  }
  auto made = TealFfnPart::Build(w.gate, w.up, ids, p.down.view(), ids, up_b,
                                 model.config().activation, cuts.gate == cuts.up, pool);
  EXPECT_TRUE(made.ok()) << made.status();
  if (made.ok()) p.part = *std::move(made);
  return p;
}

std::vector<float> RandomH(int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> h(dim);
  for (float& v : h) v = normal(rng);
  return h;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A down cut that drops some of the activations and keeps some: the largest of the candidates
// under which the whole part still reads at least a fifth of the neurons.
float BitingDownCut(const Model& model, int64_t layer, TealFfnCuts cuts,
                    const std::vector<float>& h, ThreadPool& pool) {
  std::vector<int32_t> all(model.config().ffn_dim);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> out(model.config().dim);
  float best = 0;
  for (float c : {1e-4f, 1e-3f, 3e-3f, 1e-2f, 3e-2f, 0.1f, 0.3f, 1.0f}) {
    cuts.down = c;
    Part p = PartOf(model, layer, all, cuts, pool);
    const int64_t kept = p.part.Compute(h.data(), cuts, out.data(), pool);
    if (kept >= static_cast<int64_t>(all.size()) / 5 && kept < static_cast<int64_t>(all.size())) {
      best = c;
    }
  }
  return best;
}

struct Shape {
  GgmlType type;
  const char* arch;
  SynthFfnKind kind;
};

class TealFfnPartTest : public ::testing::TestWithParam<Shape> {};

// Every neuron in one part: the copies, shares and sums are TealLinear's, bit for bit.
TEST_P(TealFfnPartTest, WholePartIsOneProcessBitForBit) {
  const Shape s = GetParam();
  const std::string name =
      "whole_" + std::string(s.arch) + "_" + std::string(TypeTraits(s.type).name);
  auto model = SynthArch(s.type, s.arch, s.kind, name);
  ASSERT_TRUE(model);
  const int64_t ffn = model->config().ffn_dim;
  std::vector<int32_t> all(ffn);
  std::iota(all.begin(), all.end(), 0);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (const bool shared : {true, false}) {
      for (int64_t layer = 0; layer < model->config().n_layers; ++layer) {
        const std::vector<float> h = RandomH(model->config().dim, 7 + layer);
        TealFfnCuts cuts{0.6f, shared ? 0.6f : 0.9f, 0.0f};
        cuts.down = BitingDownCut(*model, layer, cuts, h, pool);
        ASSERT_GT(cuts.down, 0.0f) << "no candidate cut drops part of the activations";
        const std::vector<float> want = Reference(*model, layer, cuts, h, pool);
        Part p = PartOf(*model, layer, all, cuts, pool);
        std::vector<float> got(model->config().dim);
        const int64_t kept = p.part.Compute(h.data(), cuts, got.data(), pool);
        EXPECT_GT(kept, 0);
        EXPECT_LT(kept, ffn);
        // The down bias is the caller's (SplitFfn adds it once, after the cold partial).
        AddRowBias(model->layer(layer).down_b, 1, got.data());
        EXPECT_TRUE(SameBits(got, want))
            << name << " layer " << layer << " shared " << shared << " threads " << threads;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TealFfnPartTest,
    ::testing::Values(Shape{GgmlType::kF32, "llama", SynthFfnKind::kSwiGlu},
                      Shape{GgmlType::kF16, "llama", SynthFfnKind::kSwiGlu},
                      Shape{GgmlType::kQ4_0, "llama", SynthFfnKind::kSwiGlu},
                      Shape{GgmlType::kQ8_0, "llama", SynthFfnKind::kReluGated},
                      Shape{GgmlType::kF32, "starcoder2", SynthFfnKind::kArchDefault}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      return std::string(info.param.arch) + "_" + std::string(TypeTraits(info.param.type).name);
    });

// Two parts that split the neurons (every third one to the second, as a plan might): their sum
// is the one-process output up to the order of the f32 sums (float weights; quantized copies
// also round each part's inputs against other blocks, so they are held to the whole-part test).
class TealFfnSplitTest : public ::testing::TestWithParam<Shape> {};

TEST_P(TealFfnSplitTest, SplitPartsAddUpToTheWhole) {
  const Shape s = GetParam();
  const std::string name =
      "split_" + std::string(s.arch) + "_" + std::string(TypeTraits(s.type).name);
  auto model = SynthArch(s.type, s.arch, s.kind, name);
  ASSERT_TRUE(model);
  const int64_t ffn = model->config().ffn_dim, dim = model->config().dim;
  std::vector<int32_t> a, b;
  for (int32_t i = 0; i < ffn; ++i) (i % 3 == 1 ? b : a).push_back(i);
  ThreadPool pool(2);
  const int64_t layer = 1;
  const std::vector<float> h = RandomH(dim, 99);
  TealFfnCuts cuts{0.5f, 0.7f, 0.0f};
  cuts.down = BitingDownCut(*model, layer, cuts, h, pool);
  const std::vector<float> want = Reference(*model, layer, cuts, h, pool);
  Part pa = PartOf(*model, layer, a, cuts, pool);
  Part pb = PartOf(*model, layer, b, cuts, pool);
  EXPECT_EQ(pa.part.n_neurons() + pb.part.n_neurons(), ffn);
  std::vector<float> ya(dim), yb(dim);
  pa.part.Compute(h.data(), cuts, ya.data(), pool);
  pb.part.Compute(h.data(), cuts, yb.data(), pool);
  double scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (int64_t i = 0; i < dim; ++i) {
    const double got = static_cast<double>(ya[i]) + yb[i];
    const double bias = model->layer(layer).down_b.empty() ? 0.0 : model->layer(layer).down_b[i];
    // Reordered f32 sums over ~ffn terms of this size: a few ulps of the largest output each.
    EXPECT_NEAR(got + bias, want[i], 1e-5 * std::max(1.0, scale)) << name << " output " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(FloatShapes, TealFfnSplitTest,
                         ::testing::Values(Shape{GgmlType::kF32, "llama", SynthFfnKind::kSwiGlu},
                                           Shape{GgmlType::kF16, "llama", SynthFfnKind::kSwiGlu},
                                           Shape{GgmlType::kF32, "starcoder2",
                                                 SynthFfnKind::kArchDefault}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(info.param.arch) + "_" +
                                  std::string(TypeTraits(info.param.type).name);
                         });

// A part whose neuron count is not a whole number of blocks is padded with zero rows, which
// change nothing: its output equals the same neurons' float computation within rounding.
TEST(TealFfnPartShapes, PaddedQuantizedPartAndBadShapes) {
  auto model = SynthArch(GgmlType::kQ8_0, "llama", SynthFfnKind::kSwiGlu, "padded_q8_0");
  ASSERT_TRUE(model);
  ThreadPool pool(1);
  const LayerWeights& w = model->layer(0);
  auto down = DownRows::ForLayer(*model, 0, std::nullopt, pool);
  ASSERT_TRUE(down.ok());
  const std::vector<int32_t> ids = {3, 17, 40, 41, 99};  // 5 neurons: one block of 32, padded
  auto part = TealFfnPart::Build(w.gate, w.up, ids, down->view(), ids, {},
                                 model->config().activation, true, pool);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->n_neurons(), 5);
  const std::vector<float> h = RandomH(model->config().dim, 5);
  std::vector<float> y(model->config().dim);
  EXPECT_EQ(part->Compute(h.data(), TealFfnCuts{}, y.data(), pool), 5);
  // The same five neurons through NeuronFfn (dense over them: no cut).
  NeuronWeights nw{w.gate, w.up, down->view(), model->config().activation};
  NeuronFfn neurons(model->config().ffn_dim);
  std::vector<float> want(model->config().dim, 0.0f);
  neurons.Compute(nw, h.data(), ids, NeuronFilter{}, want.data(), pool);
  double scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < y.size(); ++i) {
    // Both round h to 8 bits per block for the Q8_0 products, each its own way.
    EXPECT_NEAR(y[i], want[i], 2e-2 * std::max(1.0, scale)) << i;
  }

  const std::vector<int32_t> out_of_range = {3, 160};
  EXPECT_EQ(TealFfnPart::Build(w.gate, w.up, out_of_range, down->view(), {}, {},
                               model->config().activation, true, pool)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TealFfnPart::Build(w.gate, w.up, ids, down->view(), {1, 2}, {},
                               model->config().activation, true, pool)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TealFfnPart::Build(w.gate, w.up, ids, down->view(), ids, {1.0f},
                               model->config().activation, true, pool)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace thermocline
