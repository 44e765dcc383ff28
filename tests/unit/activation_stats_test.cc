// Activation statistics: the stats file (round trip, every validation on read), the I32 tensor
// type it shares the GGUF layer with placement files, the magnitude histogram's quantiles, and
// the profiler against direct counts over a dense forward pass: ReLU frequencies on a synthetic
// ReLU-gated model, SiLU cuts on stories260K over the TinyStories sample.
#include "shared/sparsity/activation_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/gguf/quant.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/profiler.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

void ExpectError(const absl::Status& s, const std::string& substr) {
  EXPECT_FALSE(s.ok()) << "expected an error containing: " << substr;
  EXPECT_NE(std::string(s.message()).find(substr), std::string::npos)
      << "message: " << s.message() << "\nexpected to contain: " << substr;
}

ActivationStats MakeStats(int64_t layers = 3, int64_t ffn = 40) {
  ActivationStats s;
  s.criterion = "magnitude";
  s.tokens = 1000;
  s.targets = {0.3f, 0.5f, 0.9f};
  s.frequency_target = 0.5f;
  s.dim = 16;
  s.ffn_dim = ffn;
  s.hist_log2_min = -32;
  s.hist_bins_per_octave = 1;
  s.layers.resize(layers);
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t i = 0; i < ffn; ++i) s.layers[l].frequency.push_back((i * 7 + l) % 11 / 10.0f);
    s.layers[l].cuts = {0.1f * (l + 1), 0.2f * (l + 1), 0.7f * (l + 1)};
    s.layers[l].coeff_cuts = {0.01f * (l + 1), 0.03f * (l + 1), 0.05f * (l + 1)};
    s.layers[l].histogram = {0.25f, 0.5f, 0.25f, 0.0f};
  }
  return s;
}

void ExpectSame(const ActivationStats& a, const ActivationStats& b) {
  EXPECT_EQ(a.criterion, b.criterion);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_EQ(a.frequency_target, b.frequency_target);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.ffn_dim, b.ffn_dim);
  EXPECT_EQ(a.hist_log2_min, b.hist_log2_min);
  EXPECT_EQ(a.hist_bins_per_octave, b.hist_bins_per_octave);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].frequency, b.layers[l].frequency) << "layer " << l;
    EXPECT_EQ(a.layers[l].cuts, b.layers[l].cuts) << "layer " << l;
    EXPECT_EQ(a.layers[l].coeff_cuts, b.layers[l].coeff_cuts) << "layer " << l;
    EXPECT_EQ(a.layers[l].histogram, b.layers[l].histogram) << "layer " << l;
  }
}

TEST(ActivationStatsTest, RoundTrip) {
  const ActivationStats s = MakeStats();
  const std::string path = testing::TempDir() + "/stats.gguf";
  ASSERT_TRUE(WriteActivationStats(s, path).ok());
  auto back = ReadActivationStats(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(s, *back);

  ModelConfig config;
  config.dim = 16;
  config.ffn_dim = 40;
  config.n_layers = 3;
  auto checked = ReadActivationStats(path, &config);
  ASSERT_TRUE(checked.ok()) << checked.status();
  config.ffn_dim = 41;
  ExpectError(ReadActivationStats(path, &config).status(), "this model has dim 16, ffn 41");

  // Profiles from before coefficient cuts still read; only the coefficient cuts are missing.
  ActivationStats old = MakeStats();
  for (auto& l : old.layers) l.coeff_cuts.clear();
  ASSERT_TRUE(WriteActivationStats(old, path).ok());
  auto old_back = ReadActivationStats(path);
  ASSERT_TRUE(old_back.ok()) << old_back.status();
  ExpectSame(old, *old_back);
  EXPECT_TRUE(old_back->CutFor(0, 0.5f).ok());
  ExpectError(old_back->CoeffCutFor(0, 0.5f).status(), "profile the model again");
  // Coefficient cuts in some layers only are a broken file.
  old.layers[1].coeff_cuts = {0.1f, 0.2f, 0.3f};
  ExpectError(WriteActivationStats(old, path), "coefficient cuts present in some layers only");
}

TEST(ActivationStatsTest, ReluWithoutTargetsOrHistogramRoundTrips) {
  ActivationStats s = MakeStats(2, 32);
  s.criterion = "relu";
  s.targets.clear();
  s.hist_bins_per_octave = 0;
  s.hist_log2_min = 0;
  for (auto& l : s.layers) {
    l.cuts.clear();
    l.coeff_cuts.clear();
    l.histogram.clear();
  }
  const std::string path = testing::TempDir() + "/relu.gguf";
  ASSERT_TRUE(WriteActivationStats(s, path).ok());
  auto back = ReadActivationStats(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(s, *back);
}

TEST(ActivationStatsTest, CutFor) {
  const ActivationStats s = MakeStats();
  auto c = s.CutFor(1, 0.5f);
  ASSERT_TRUE(c.ok());
  EXPECT_FLOAT_EQ(*c, 0.4f);
  EXPECT_TRUE(s.CutFor(2, 0.90005f).ok());  // within the 1e-4 tolerance
  ExpectError(s.CutFor(0, 0.6f).status(), "targets: 0.3, 0.5, 0.9");
  ExpectError(s.CutFor(3, 0.5f).status(), "layer 3 is out of range");
  ExpectError(s.CutFor(-1, 0.5f).status(), "layer -1 is out of range");
  auto cc = s.CoeffCutFor(1, 0.5f);
  ASSERT_TRUE(cc.ok()) << cc.status();
  EXPECT_FLOAT_EQ(*cc, 0.06f);
  ExpectError(s.CoeffCutFor(0, 0.6f).status(), "targets: 0.3, 0.5, 0.9");
}

// MoE layers: per-expert frequencies and cuts (expert-major), checked against the model.
TEST(ActivationStatsTest, PerExpertStatsRoundTripAndAreChecked) {
  ActivationStats s = MakeStats(2, 8);
  s.n_experts = 3;
  LayerActivationStats& moe = s.layers[1];
  moe.experts = 3;
  moe.frequency.assign(24, 0.25f);
  moe.cuts = {0.1f, 0.2f, 0.3f, 1.0f, 2.0f, 3.0f, 0.5f, 0.5f, 0.6f};
  moe.coeff_cuts = {0.01f, 0.02f, 0.03f, 0.1f, 0.2f, 0.3f, 0.05f, 0.05f, 0.06f};
  moe.expert_share = {0.5f, 1.0f, 0.5f};
  const std::string path = testing::TempDir() + "/moe_stats.gguf";
  ASSERT_TRUE(WriteActivationStats(s, path).ok());
  ModelConfig c;
  c.dim = 16;
  c.ffn_dim = 8;
  c.n_layers = 2;
  c.n_experts = 3;
  c.n_experts_used = 2;
  c.layers.resize(2);
  c.layers[1].moe = true;
  auto back = ReadActivationStats(path, &c);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->n_experts, 3);
  EXPECT_EQ(back->layers[0].experts, 0);
  EXPECT_EQ(back->layers[1].experts, 3);
  EXPECT_EQ(back->layers[1].frequency, moe.frequency);
  EXPECT_EQ(back->layers[1].expert_share, moe.expert_share);
  EXPECT_EQ(*back->CutFor(1, 0.5f, 1), 2.0f);
  EXPECT_EQ(*back->CoeffCutFor(1, 0.9f, 2), 0.06f);
  EXPECT_EQ(*back->CutFor(0, 0.5f), 0.2f);
  ExpectError(back->CutFor(1, 0.5f).status(), "layer 1 has cuts for 3 experts, not for expert -1");
  ExpectError(back->CutFor(1, 0.5f, 3).status(), "not for expert 3");
  ExpectError(back->CutFor(0, 0.5f, 0).status(), "layer 0 has no experts");

  // The model decides which layers have experts, and how many.
  ModelConfig dense_layers = c;
  dense_layers.layers[1].moe = false;
  dense_layers.n_experts = 3;
  ExpectError(ReadActivationStats(path, &dense_layers).status(),
              "layer 1 has per-expert statistics, but the model's layer 1 has no experts");
  ModelConfig four = c;
  four.n_experts = 4;
  ExpectError(ReadActivationStats(path, &four).status(),
              "profiled a model of 3 experts per MoE layer; this model has 4");
  ActivationStats old = MakeStats(2, 8);
  ASSERT_TRUE(WriteActivationStats(old, path).ok());
  ExpectError(ReadActivationStats(path, &c).status(), "the statistics of its experts are missing");

  // Each expert's cuts must ascend on their own, and the errors name the expert.
  ActivationStats bad = s;
  bad.layers[1].cuts[4] = 0.5f;  // expert 1: 1.0, 0.5, 3.0
  ExpectError(WriteActivationStats(bad, path), "layer 1 expert 1: cuts are not ascending");
  bad = s;
  bad.layers[1].frequency[17] = 2.0f;
  ExpectError(WriteActivationStats(bad, path), "layer 1 expert 2: frequency of neuron 1 = 2");
  bad = s;
  bad.layers[1].expert_share = {0.5f, 1.5f, 0.0f};
  ExpectError(WriteActivationStats(bad, path), "layer 1 expert 1: share 1.5 of the tokens");
  bad.layers[1].expert_share = {0.5f};
  ExpectError(WriteActivationStats(bad, path), "layer 1: 1 expert shares for 3 experts");
  bad = s;
  bad.layers[1].coeff_cuts.pop_back();
  ExpectError(WriteActivationStats(bad, path), "8 coefficient cuts for 3 targets x 3 experts");
}

TEST(ActivationStatsTest, WriteRejectsInvalidStats) {
  const std::string path = testing::TempDir() + "/bad.gguf";
  ActivationStats s = MakeStats();
  s.layers[1].frequency[3] = std::numeric_limits<float>::quiet_NaN();
  ExpectError(WriteActivationStats(s, path), "layer 1: frequency of neuron 3");
  s = MakeStats();
  s.frequency_target = 0.6f;
  ExpectError(WriteActivationStats(s, path), "frequency_target 0.6 is not one of the targets");
  s = MakeStats();
  s.layers[0].frequency.pop_back();
  ExpectError(WriteActivationStats(s, path), "layer 0: 39 frequencies, expected 40");
}

// Writes a stats-like file key by key, so each test can break exactly one thing.
struct RawStats {
  std::string arch = "thermocline.stats";
  std::string criterion = "magnitude";
  uint64_t tokens = 100;
  std::vector<float> targets = {0.3f, 0.5f};
  float frequency_target = 0.5f;
  uint32_t dim = 8, ffn = 4, blocks = 2;
  std::vector<std::vector<float>> freq = {{0, 0.5f, 1, 0.25f}, {1, 1, 0, 0}};
  std::vector<std::vector<float>> cuts = {{0.1f, 0.2f}, {0.3f, 0.4f}};
  GgmlType freq_type = GgmlType::kF32;
  bool skip_layer1_freq = false;

  std::string Write() const {
    GgufWriter w;
    w.SetValue("general.architecture", GgufString(arch));
    w.SetValue("thermocline.stats.tokens", GgufU64(tokens));
    w.SetValue("thermocline.stats.criterion", GgufString(criterion));
    w.SetValue("thermocline.stats.targets", GgufF32Array(targets));
    w.SetValue("thermocline.stats.frequency_target", GgufF32(frequency_target));
    w.SetValue("thermocline.stats.model_dim", GgufU32(dim));
    w.SetValue("thermocline.stats.model_ffn_dim", GgufU32(ffn));
    w.SetValue("thermocline.stats.block_count", GgufU32(blocks));
    for (size_t l = 0; l < freq.size(); ++l) {
      if (!(l == 1 && skip_layer1_freq)) {
        std::string bytes(RowBytes(freq_type, freq[l].size()), '\0');
        QuantizeRow(freq_type, freq[l].data(), bytes.data(), freq[l].size());
        EXPECT_TRUE(w.AddTensorBytes(absl::StrCat("blk.", l, ".act_freq"), freq_type,
                                     {static_cast<int64_t>(freq[l].size())}, bytes)
                        .ok());
      }
      EXPECT_TRUE(w.AddTensorBytes(absl::StrCat("blk.", l, ".act_cuts"), GgmlType::kF32,
                                   {static_cast<int64_t>(cuts[l].size())},
                                   std::string_view(reinterpret_cast<const char*>(cuts[l].data()),
                                                    cuts[l].size() * 4))
                      .ok());
    }
    const std::string path = testing::TempDir() + "/raw.gguf";
    EXPECT_TRUE(w.WriteFile(path).ok());
    return path;
  }
  absl::Status ReadError() const { return ReadActivationStats(Write()).status(); }
};

TEST(ActivationStatsTest, ReadValidatesEverything) {
  ASSERT_TRUE(RawStats().ReadError().ok()) << RawStats().ReadError();
  {
    RawStats r;
    r.arch = "llama";
    ExpectError(r.ReadError(), "general.architecture is 'llama', expected 'thermocline.stats'");
  }
  {
    RawStats r;
    r.criterion = "gelu";
    ExpectError(r.ReadError(), "criterion 'gelu' is not one of: relu, magnitude");
  }
  {
    RawStats r;
    r.tokens = 0;
    ExpectError(r.ReadError(), "thermocline.stats.tokens = 0 is out of range");
  }
  {
    RawStats r;
    r.targets = {0.5f, 0.3f};
    ExpectError(r.ReadError(), "targets are not strictly ascending");
  }
  {
    RawStats r;
    r.targets = {0.5f, 1.0f};
    ExpectError(r.ReadError(), "target 1 = 1 is not in (0, 1)");
  }
  {
    RawStats r;
    r.frequency_target = 0.4f;
    ExpectError(r.ReadError(), "frequency_target 0.4 is not one of the targets");
  }
  {
    RawStats r;
    r.freq[1][2] = 1.5f;
    ExpectError(r.ReadError(), "layer 1: frequency of neuron 2 = 1.5 is not in [0, 1]");
  }
  {
    RawStats r;
    r.freq[0][0] = -0.1f;
    ExpectError(r.ReadError(), "layer 0: frequency of neuron 0 = -0.1");
  }
  {
    RawStats r;
    r.cuts[1][0] = std::numeric_limits<float>::infinity();
    ExpectError(r.ReadError(), "layer 1: cut 0 = inf is not a finite value >= 0");
  }
  {
    RawStats r;
    r.cuts[0] = {0.5f, 0.2f};
    ExpectError(r.ReadError(), "layer 0: cuts are not ascending with the targets");
  }
  {
    RawStats r;
    r.cuts[0] = {0.1f, 0.2f, 0.3f};
    ExpectError(r.ReadError(), "tensor 'blk.0.act_cuts' has shape (3), expected (2)");
  }
  {
    RawStats r;
    r.freq[0].push_back(0);
    ExpectError(r.ReadError(), "tensor 'blk.0.act_freq' has shape (5), expected (4)");
  }
  {
    RawStats r;
    r.freq_type = GgmlType::kF16;
    ExpectError(r.ReadError(), "tensor 'blk.0.act_freq' has type f16, expected f32");
  }
  {
    RawStats r;
    r.skip_layer1_freq = true;
    ExpectError(r.ReadError(), "tensor 'blk.1.act_freq' is missing");
  }
  {
    RawStats r;
    r.blocks = 3;
    ExpectError(r.ReadError(), "tensor 'blk.2.act_freq' is missing");
  }
  // Not a GGUF at all, and a truncated one: the GGUF reader's error, with the path.
  const std::string good = RawStats().Write();
  const std::string bytes = testing::ReadFileOrDie(good);
  const std::string cut = testing::TempDir() + "/truncated.gguf";
  std::ofstream(cut, std::ios::binary).write(bytes.data(), bytes.size() / 2);
  ExpectError(ReadActivationStats(cut).status(), "activation stats " + cut);
  ExpectError(ReadActivationStats(testing::TempDir() + "/none.gguf").status(), "none.gguf");
}

// I32 is the tensor type of PowerInfer's placement tensors. It is stored as id 26 in GGUF files
// and as 18 (PowerInfer's ggml numbering) in PWRI files, and both read back as I32.
TEST(ActivationStatsTest, I32TensorsRoundTripInGgufAndPowerInferFiles) {
  const std::vector<int32_t> values = {0, 1, -1, 2147483647, -2147483647 - 1, 42};
  for (bool powerinfer : {false, true}) {
    GgufWriter w;
    w.set_powerinfer_magic(powerinfer);
    w.SetValue("general.architecture", GgufString("test"));
    ASSERT_TRUE(w.AddTensorBytes("ints", GgmlType::kI32, {6},
                                 std::string_view(reinterpret_cast<const char*>(values.data()), 24))
                    .ok());
    const std::string path = testing::TempDir() + (powerinfer ? "/i32.pwri" : "/i32.gguf");
    ASSERT_TRUE(w.WriteFile(path).ok());
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->is_powerinfer(), powerinfer);
    const GgufTensorInfo* t = (*f)->FindTensor("ints");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, GgmlType::kI32);
    EXPECT_EQ(t->n_bytes, 24);
    std::vector<int32_t> back(6);
    std::memcpy(back.data(), t->data, 24);
    EXPECT_EQ(back, values);
    // The type id as stored: after the name, n_dims (4 bytes) and one dim (8 bytes).
    const std::string bytes = testing::ReadFileOrDie(path);
    const size_t at = bytes.find("ints") + 4 + 4 + 8;
    uint32_t id = 0;
    std::memcpy(&id, bytes.data() + at, 4);
    EXPECT_EQ(id, powerinfer ? 18u : 26u);
  }
  EXPECT_EQ(TypeTraits(GgmlType::kI32).name, "i32");
  EXPECT_EQ(TypeFromName("i32"), GgmlType::kI32);
  EXPECT_FALSE(IsWeightType(GgmlType::kI32));
  // In PWRI files 16 and 17 are PowerInfer's I8 and I16; in today's numbering 16..18 are
  // i-quants.
  EXPECT_EQ(TypeTraitsInFile(16, true)->type, GgmlType::kI8);
  EXPECT_EQ(TypeTraitsInFile(17, true)->type, GgmlType::kI16);
  EXPECT_EQ(TypeTraitsInFile(18, false)->type, GgmlType::kIQ3_XXS);
  EXPECT_EQ(TypeIdInFile(GgmlType::kI16, true), 17u);

  // Rows convert as integers: rounding to nearest even, saturation, NaN to 0.
  const std::vector<float> in = {
      1.4f, 1.5f, 2.5f, -3.7f, 3e9f, -3e9f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<int32_t> q(in.size());
  QuantizeRow(GgmlType::kI32, in.data(), q.data(), static_cast<int64_t>(in.size()));
  EXPECT_EQ(q, (std::vector<int32_t>{1, 2, 2, -4, 2147483647, -2147483647 - 1, 0}));
  std::vector<float> f(q.size());
  DequantizeRow(GgmlType::kI32, q.data(), f.data(), static_cast<int64_t>(q.size()));
  EXPECT_EQ(f[3], -4.0f);
  EXPECT_EQ(f[4], 2147483647.0f);
}

TEST(MagnitudeHistogramTest, QuantilesAreWithinOneBinOfExact) {
  std::mt19937 rng(7);
  std::exponential_distribution<float> expo(3.0f);
  std::vector<float> values;
  MagnitudeHistogram h;
  for (int i = 0; i < 200000; ++i) {
    // A mix of exact zeros, tiny values and a long tail, like |silu| and relu magnitudes.
    float v = i % 10 == 0 ? 0.0f : expo(rng) * (i % 3 == 0 ? 1e-4f : 1.0f);
    values.push_back(v);
    h.Add(v);
  }
  std::sort(values.begin(), values.end());
  auto share_below = [&](float cut) {
    return static_cast<double>(std::lower_bound(values.begin(), values.end(), cut) -
                               values.begin()) /
           static_cast<double>(values.size());
  };
  for (double q : {0.15, 0.3, 0.5, 0.75, 0.9, 0.99}) {
    const float cut = h.Quantile(q);
    const float exact = values[static_cast<size_t>(q * values.size())];
    EXPECT_NEAR(cut / exact, 1.0, 1.0 / 256) << "q " << q;
    EXPECT_NEAR(share_below(cut), q, 2e-3) << "q " << q;
    // ShareBelow inverts Quantile up to the rounding of the cut to a float.
    EXPECT_NEAR(h.ShareBelow(cut), q, 1e-5) << "q " << q;
  }
  // A target inside the atom of exact zeros gets a cut just above zero: every zero is skipped,
  // every nonzero kept, the closest a cut can get.
  const float zero_cut = h.Quantile(0.05);
  EXPECT_GT(zero_cut, 0.0f);
  EXPECT_LT(zero_cut, 1e-30f);
  EXPECT_NEAR(share_below(zero_cut), 0.1, 1e-4);  // a float draw of the tail can be 0 too
  const std::vector<float> octaves = h.OctaveShares(-32, 48);
  double sum = 0;
  for (float s : octaves) sum += s;
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_NEAR(octaves[0], 0.1, 1e-3);  // the exact zeros
}

// Counts, per layer and neuron, what a dense forward pass computes, independently of the
// profiler: tokens with gate > 0, and per layer the magnitudes below given cuts.
class DirectCounter final : public FfnObserver {
 public:
  DirectCounter(const ModelConfig& c, std::vector<std::vector<float>> cuts)
      : c_(c),
        cuts_(std::move(cuts)),
        positive_(c.n_layers, std::vector<int64_t>(c.ffn_dim)),
        below_(c.n_layers, std::vector<int64_t>(cuts_.empty() ? 0 : cuts_[0].size())),
        tokens_(c.n_layers) {}
  void OnFfn(int64_t layer, const float*, const float* gate, const float*,
             int64_t n_tokens) override {
    tokens_[layer] += n_tokens;
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t i = 0; i < c_.ffn_dim; ++i) {
        const double g = gate[t * c_.ffn_dim + i];
        if (g > 0) ++positive_[layer][i];
        const double m = c_.activation == FfnActivation::kRelu ? std::max(g, 0.0)
                                                               : std::fabs(g / (1 + std::exp(-g)));
        for (size_t k = 0; k < below_[layer].size(); ++k) below_[layer][k] += m < cuts_[layer][k];
      }
    }
  }
  const ModelConfig& c_;
  std::vector<std::vector<float>> cuts_;
  std::vector<std::vector<int64_t>> positive_, below_;
  std::vector<int64_t> tokens_;
};

void RunDirect(const Model& model, std::span<const int32_t> tokens, int64_t window,
               DirectCounter& counter) {
  ThreadPool pool(1);
  auto kv = KvCache::Create(model.config(), 1, window, GgmlType::kF32);
  ASSERT_TRUE(kv.ok());
  DenseFfn ffn(model, pool);
  ffn.set_observer(&counter);
  ForwardPass pass(model, *kv, pool, &ffn);
  CorpusWindowOptions wo;
  wo.window = window;
  wo.want_logits = false;
  auto n = RunCorpusWindows(pass, tokens, wo, [](auto, auto) {});
  ASSERT_TRUE(n.ok()) << n.status();
}

std::string CorpusPath() {
  return testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt";
}

TEST(ProfilerTest, ReluFrequenciesMatchADirectCount) {
  const std::string path = testing::TempDir() + "/relu.gguf";
  const auto r = testing::RunCommand({testing::BinDir() + "/thermocline",
                                      "synth",
                                      "--ffn-kind",
                                      "relu-gated",
                                      "--dim",
                                      "64",
                                      "--ffn",
                                      "96",
                                      "--layers",
                                      "2",
                                      "--heads",
                                      "4",
                                      "--kv-heads",
                                      "2",
                                      "--vocab",
                                      "300",
                                      "--context",
                                      "128",
                                      "--seed",
                                      "3",
                                      "-o",
                                      path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->config().activation, FfnActivation::kRelu);
  auto tokens = TokenizeCorpusFile(CorpusPath(), (*model)->tokenizer(), 1200);
  ASSERT_TRUE(tokens.ok()) << tokens.status();

  ProfileOptions o;
  o.window = 64;
  o.batch = 24;  // windows split over several forward calls
  ThreadPool pool(2);
  auto result = ProfileActivations(**model, *tokens, o, pool);
  ASSERT_TRUE(result.ok()) << result.status();
  const ActivationStats& s = result->stats;
  EXPECT_EQ(s.criterion, "relu");
  EXPECT_EQ(result->passes, 1);
  EXPECT_EQ(result->windows, 1200 / 63);
  EXPECT_EQ(s.tokens, result->windows * 64);

  DirectCounter direct((*model)->config(), {});
  RunDirect(**model, *tokens, 64, direct);
  for (int64_t l = 0; l < 2; ++l) {
    ASSERT_EQ(direct.tokens_[l], s.tokens);
    double active = 0;
    for (int64_t i = 0; i < 96; ++i) {
      EXPECT_FLOAT_EQ(s.layers[l].frequency[i],
                      static_cast<float>(direct.positive_[l][i] / static_cast<double>(s.tokens)))
          << "layer " << l << " neuron " << i;
      active += direct.positive_[l][i];
    }
    // For a ReLU model the natural sparsity is the measured one.
    EXPECT_NEAR(result->layers[l].gate_nonpositive, 1 - active / (96.0 * s.tokens), 1e-9);
    EXPECT_NEAR(result->layers[l].measured_sparsity, result->layers[l].gate_nonpositive, 1e-6);
  }
}

TEST(ProfilerTest, SiluCutsReachTheirTargetSparsityOnStories260K) {
  auto model = Model::Load(testing::ModelPath("stories260K/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto tokens = TokenizeCorpusFile(CorpusPath(), (*model)->tokenizer(), 4096);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ProfileOptions o;  // window 256, targets 0.1 .. 0.9, frequencies at 0.5
  ThreadPool pool(2);
  auto result = ProfileActivations(**model, *tokens, o, pool);
  ASSERT_TRUE(result.ok()) << result.status();
  const ActivationStats& s = result->stats;
  EXPECT_EQ(s.criterion, "magnitude");
  EXPECT_EQ(result->passes, 2);
  const int64_t n_layers = (*model)->config().n_layers;

  std::vector<std::vector<float>> cuts;
  for (const auto& l : s.layers) cuts.push_back(l.cuts);
  DirectCounter direct((*model)->config(), cuts);
  RunDirect(**model, *tokens, 256, direct);
  const double n = static_cast<double>(s.tokens) * (*model)->config().ffn_dim;
  for (int64_t l = 0; l < n_layers; ++l) {
    for (size_t k = 0; k < s.targets.size(); ++k) {
      const double measured = direct.below_[l][k] / n;
      EXPECT_NEAR(measured, s.targets[k], 0.02) << "layer " << l << " target " << s.targets[k];
    }
    // The stored frequencies count exactly the magnitudes at or above the 0.5 cut.
    double freq_sum = 0;
    for (float f : s.layers[l].frequency) freq_sum += f;
    const size_t half = std::find(s.targets.begin(), s.targets.end(), 0.5f) - s.targets.begin();
    ASSERT_LT(half, s.targets.size());
    const double below_half = direct.below_[l][half] / n;
    EXPECT_NEAR(1 - freq_sum / (*model)->config().ffn_dim, below_half, 1e-5) << "layer " << l;
    EXPECT_NEAR(result->layers[l].measured_sparsity, below_half, 1e-5);
  }

  // The same statistics on one thread: counting never depends on how work is split.
  ThreadPool one(1);
  auto again = ProfileActivations(**model, *tokens, o, one);
  ASSERT_TRUE(again.ok());
  for (int64_t l = 0; l < n_layers; ++l) {
    EXPECT_EQ(again->stats.layers[l].cuts, s.layers[l].cuts);
    EXPECT_EQ(again->stats.layers[l].frequency, s.layers[l].frequency);
  }

  // And the file keeps all of it.
  const std::string path = testing::TempDir() + "/s260.stats.gguf";
  ASSERT_TRUE(WriteActivationStats(s, path).ok());
  auto back = ReadActivationStats(path, &(*model)->config());
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(s, *back);
}

TEST(ProfilerTest, OptionsAreValidated) {
  ModelConfig c;
  c.context_length = 512;
  ProfileOptions o;
  EXPECT_TRUE(ValidateProfileOptions(o, c).ok());
  o.window = 513;
  ExpectError(ValidateProfileOptions(o, c), "--window 513 must be in [2, 512]");
  o = ProfileOptions();
  o.targets = {0.5f, 0.4f};
  ExpectError(ValidateProfileOptions(o, c), "strictly ascending");
  o.targets = {0.5f, 1.2f};
  ExpectError(ValidateProfileOptions(o, c), "1.2 is not a sparsity in (0, 1)");
  o.targets = {0.3f, 0.7f};
  ExpectError(ValidateProfileOptions(o, c), "--frequency-target 0.5 must be one of the --targets");
  o.targets.clear();
  ExpectError(ValidateProfileOptions(o, c), "at least one target");
}

}  // namespace
}  // namespace thermocline
