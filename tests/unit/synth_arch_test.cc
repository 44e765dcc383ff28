// `synth --arch`: every architecture's synthetic file loads (the loader refuses any tensor the
// architecture does not use and any required one that is missing or misshapen, so loading is
// the check that the file holds exactly that architecture's tensors), runs, and is
// deterministic; MoE routers route.
#include "shared/model/synth_arch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/arch.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/gguf/quant.h"
#include "shared/model/synth.h"
#include "shared/runtime/forward.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

SynthOptions Small(const std::string& arch) {
  SynthOptions o;
  o.arch = arch;
  o.dim = 64;
  o.ffn = 96;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 300;
  o.context = 64;
  o.threads = 1;
  return o;
}

std::string Write(const SynthOptions& o, const std::string& name) {
  const std::string path = testing::TempDir() + "/" + name + ".gguf";
  absl::Status s = WriteSynthModel(o, path);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

// Logits of every position of `tokens` run as one sequence.
std::vector<float> RunTokens(const Model& model, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = model.config();
  auto kv = KvCache::Create(c, 1, static_cast<int64_t>(tokens.size()), GgmlType::kF32);
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return {};
  ThreadPool pool(1);
  ForwardPass pass(model, *kv, pool);
  std::vector<BatchEntry> batch;
  for (size_t p = 0; p < tokens.size(); ++p) {
    batch.push_back({0, static_cast<int32_t>(p), tokens[p], true});
  }
  std::vector<float> logits;
  absl::Status s = pass.Run(batch, logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

std::vector<std::string> ArchNames() {
  std::vector<std::string> names;
  for (const ArchSpec* a : AllArchs()) names.emplace_back(a->name);
  return names;
}

TEST(SynthArchTest, OneLayoutPerArchitecture) {
  EXPECT_EQ(AllSynthArchLayouts().size(), AllArchs().size());
  for (const ArchSpec* a : AllArchs()) {
    const SynthArchLayout* l = FindSynthArchLayout(a->name);
    ASSERT_NE(l, nullptr) << a->name;
    // Layouts with experts only belong to architectures that have them.
    if (l->experts_only || l->shared_expert || l->expert_ffn_key) {
      EXPECT_TRUE(a->moe) << a->name;
    }
  }
  EXPECT_EQ(FindSynthArchLayout("gpt2"), nullptr);
}

class EveryArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryArchTest, LoadsRunsAndIsDeterministic) {
  const std::string arch = GetParam();
  const SynthOptions o = Small(arch);
  const std::string path = Write(o, "arch_" + arch);
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  ASSERT_NE(c.arch, nullptr);
  EXPECT_EQ(c.arch->name, arch);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.vocab_size, 300);
  EXPECT_EQ(c.activation, c.arch->activation);  // the architecture's own by default

  // The parameter count the command prints is the file's.
  int64_t elements = 0;
  for (const GgufTensorInfo& t : (*model)->file().tensors()) elements += t.n_elements;
  EXPECT_EQ(elements, SynthParameterCount(o));

  const std::vector<int32_t> tokens = {1, 40, 41, 300 - 1, 7};
  const std::vector<float> logits = RunTokens(**model, tokens);
  ASSERT_EQ(logits.size(), tokens.size() * 300);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  // Positions see different contexts: their logits differ.
  EXPECT_NE(std::vector<float>(logits.begin(), logits.begin() + 300),
            std::vector<float>(logits.begin() + 300, logits.begin() + 600));

  // Same options, same bytes (for any thread count); another seed, other bytes.
  SynthOptions threads = o;
  threads.threads = 3;
  const std::string again = Write(threads, "arch_" + arch + "_again");
  const std::string bytes = testing::ReadFileOrDie(path);
  EXPECT_EQ(bytes, testing::ReadFileOrDie(again));
  SynthOptions other = o;
  other.seed = 2;
  EXPECT_NE(bytes, testing::ReadFileOrDie(Write(other, "arch_" + arch + "_seed2")));

  // `thermocline info` lists it.
  testing::CommandResult r =
      testing::RunCommand({testing::BinDir() + "/thermocline", "info", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "general.architecture")) << r.out;
  EXPECT_TRUE(Contains(r.out, "\"" + arch + "\"")) << r.out;
  EXPECT_TRUE(Contains(r.out, "tensors: " + std::to_string((*model)->file().tensors().size())));
}

// The ReLU variant of every architecture loads as ReLU (unshaped where the design does not fit).
TEST_P(EveryArchTest, ReluVariant) {
  const std::string arch = GetParam();
  SynthOptions o = Small(arch);
  o.ffn_kind = SynthFfnKind::kReluGated;
  o.active_fraction = 0;
  auto model = Model::Load(Write(o, "relu_" + arch));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().activation, FfnActivation::kRelu);
  const std::vector<float> logits = RunTokens(**model, {1, 50, 60});
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

INSTANTIATE_TEST_SUITE_P(Archs, EveryArchTest, ::testing::ValuesIn(ArchNames()),
                         [](const auto& info) { return info.param; });

// What distinguishes each family's file, beyond what loading checks.
TEST(SynthArchTest, DistinctiveTensors) {
  struct Case {
    std::string arch;
    std::vector<std::pair<std::string, std::vector<int64_t>>> present;
    std::vector<std::string> absent;
  };
  // Small(): dim 64, ffn 96, 4 heads of 16, 2 kv heads: q 64, kv 32.
  const std::vector<Case> cases = {
      {"llama",
       {{"blk.0.ffn_gate.weight", {64, 96}}, {"output.weight", {64, 300}}},
       {"blk.0.attn_q.bias"}},
      {"qwen2",
       {{"blk.0.attn_q.bias", {64}}, {"blk.0.attn_k.bias", {32}}, {"blk.1.attn_v.bias", {32}}},
       {"blk.0.attn_output.bias"}},
      {"qwen3", {{"blk.0.attn_q_norm.weight", {16}}, {"blk.0.attn_k_norm.weight", {16}}}, {}},
      {"olmo2",
       {{"blk.0.attn_q_norm.weight", {64}},
        {"blk.0.attn_k_norm.weight", {32}},
        {"blk.0.post_attention_norm.weight", {64}},
        {"blk.0.post_ffw_norm.weight", {64}}},
       {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"}},
      {"gemma2",
       {{"blk.0.post_attention_norm.weight", {64}}, {"blk.0.post_ffw_norm.weight", {64}}},
       {"output.weight"}},
      {"gemma3", {{"blk.1.attn_q_norm.weight", {16}}}, {"output.weight"}},
      {"phi3",
       {{"blk.0.attn_qkv.weight", {64, 128}}, {"blk.0.ffn_up.weight", {64, 192}}},
       {"blk.0.attn_q.weight", "blk.0.ffn_gate.weight"}},
      {"starcoder2",
       {{"blk.0.attn_norm.bias", {64}},
        {"blk.0.ffn_norm.bias", {64}},
        {"output_norm.bias", {64}},
        {"blk.0.attn_q.bias", {64}},
        {"blk.0.attn_output.bias", {64}},
        {"blk.0.ffn_up.bias", {96}},
        {"blk.0.ffn_down.bias", {64}}},
       {"blk.0.ffn_gate.weight"}},
      {"falcon",
       {{"blk.0.attn_qkv.weight", {64, 128}},
        {"blk.0.attn_norm.bias", {64}},
        {"blk.0.ffn_up.weight", {64, 96}},
        {"blk.0.ffn_down.weight", {96, 64}}},
       {"blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.attn_qkv.bias"}},
      {"qwen2moe",
       {{"blk.0.ffn_gate_inp.weight", {64, 4}},
        {"blk.0.ffn_gate_exps.weight", {64, 96, 4}},
        {"blk.0.ffn_up_exps.weight", {64, 96, 4}},
        {"blk.0.ffn_down_exps.weight", {96, 64, 4}},
        {"blk.0.ffn_gate_inp_shexp.weight", {64}},
        {"blk.0.ffn_gate_shexp.weight", {64, 96}},
        {"blk.0.ffn_down_shexp.weight", {96, 64}},
        {"blk.0.attn_q.bias", {64}}},
       {"blk.0.ffn_gate.weight"}},
      {"qwen3moe", {{"blk.1.ffn_down_exps.weight", {96, 64, 4}}}, {"blk.0.ffn_gate_shexp.weight"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.arch);
    auto f = GgufFile::Open(Write(Small(c.arch), "distinct_" + c.arch));
    ASSERT_TRUE(f.ok()) << f.status();
    for (const auto& [name, ne] : c.present) {
      const GgufTensorInfo* t = (*f)->FindTensor(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->ne, ne) << name;
    }
    for (const std::string& name : c.absent) EXPECT_EQ((*f)->FindTensor(name), nullptr) << name;
  }
}

TEST(SynthArchTest, ArchKeys) {
  auto key = [](const std::string& arch, SynthOptions o, const std::string& k) {
    auto f = GgufFile::Open(Write(o, "keys_" + arch));
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() && (*f)->FindValue(k) != nullptr;
  };
  EXPECT_TRUE(key("gemma2", Small("gemma2"), "gemma2.attn_logit_softcapping"));
  EXPECT_TRUE(key("gemma2", Small("gemma2"), "gemma2.final_logit_softcapping"));
  EXPECT_TRUE(key("qwen2moe", Small("qwen2moe"), "qwen2moe.expert_shared_feed_forward_length"));
  EXPECT_TRUE(key("falcon", Small("falcon"), "falcon.attention.layer_norm_epsilon"));
  EXPECT_FALSE(key("llama", Small("llama"), "llama.attention.key_length"));
}

TEST(SynthArchTest, HeadDimExpertsAndWindow) {
  // Heads wider than dim / heads (gemma's and qwen3's shapes).
  SynthOptions o = Small("qwen3");
  o.head_dim = 32;
  auto model = Model::Load(Write(o, "head_dim"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().head_dim, 32);
  EXPECT_EQ((*model)->config().q_dim, 128);
  for (float x : RunTokens(**model, {1, 2, 3})) ASSERT_TRUE(std::isfinite(x));

  // Expert widths and counts.
  o = Small("qwen3moe");
  o.experts = 6;
  o.experts_used = 3;
  o.expert_ffn = 32;
  model = Model::Load(Write(o, "experts"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().n_experts, 6);
  EXPECT_EQ((*model)->config().n_experts_used, 3);
  EXPECT_EQ((*model)->config().ffn_dim, 32);

  // Mixtral-style llama.
  o = Small("llama");
  o.experts = 8;
  model = Model::Load(Write(o, "llama_moe"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().n_experts, 8);
  EXPECT_EQ((*model)->config().n_experts_used, 2);
  EXPECT_EQ((*model)->config().ffn_dim, 96);

  // gemma2 slides on even layers.
  o = Small("gemma2");
  o.sliding_window = 2;
  model = Model::Load(Write(o, "window"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().layers[0].sliding_window, 2);
  EXPECT_EQ((*model)->config().layers[1].sliding_window, 0);
}

// Each token's top-k experts from the layer's router over h = ffn_norm(embedding): different
// tokens must pick different experts, or the MoE path is a dense FFN in disguise.
TEST(SynthArchTest, RoutersRoute) {
  for (const std::string arch : {"qwen2moe", "qwen3moe", "llama"}) {
    SCOPED_TRACE(arch);
    SynthOptions o = Small(arch);
    o.experts = 8;
    auto model = Model::Load(Write(o, "route_" + arch));
    ASSERT_TRUE(model.ok()) << model.status();
    const ModelConfig& c = (*model)->config();
    const LayerWeights& w = (*model)->layer(0);
    ASSERT_EQ(w.router.rows, 8);
    std::set<std::vector<int64_t>> picks;
    std::set<int64_t> top1;
    std::vector<float> x(c.dim), h(c.dim), row(c.dim);
    for (int32_t token = 3; token < 3 + 64; ++token) {
      const MatrixView& e = (*model)->token_embd();
      DequantizeRow(e.type, e.row(token), x.data(), c.dim);
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const float inv = static_cast<float>(1 / std::sqrt(ss / c.dim + c.rms_eps));
      for (int64_t j = 0; j < c.dim; ++j) h[j] = x[j] * inv * w.ffn_norm[j];
      std::vector<std::pair<float, int64_t>> scores;
      for (int64_t ex = 0; ex < w.router.rows; ++ex) {
        DequantizeRow(w.router.type, w.router.row(ex), row.data(), c.dim);
        float s = 0;
        for (int64_t j = 0; j < c.dim; ++j) s += row[j] * h[j];
        scores.push_back({-s, ex});
      }
      std::sort(scores.begin(), scores.end());
      std::vector<int64_t> chosen;
      for (int64_t k = 0; k < c.n_experts_used; ++k) chosen.push_back(scores[k].second);
      std::sort(chosen.begin(), chosen.end());
      picks.insert(chosen);
      top1.insert(scores[0].second);
    }
    EXPECT_GE(picks.size(), 8u);  // of 28 possible pairs
    EXPECT_GE(top1.size(), 6u);   // of 8 experts
  }
}

// ---------------------------------------------------------------------------------------------
// The command.

testing::CommandResult Synth(std::vector<std::string> args) {
  args.insert(args.begin(), {testing::BinDir() + "/thermocline", "synth"});
  return testing::RunCommand(args);
}

TEST(SynthArchCommandTest, WritesEveryArch) {
  for (const std::string& arch : ArchNames()) {
    const std::string path = testing::TempDir() + "/cmd_" + arch + ".gguf";
    testing::CommandResult r =
        Synth({"-o", path, "--arch", arch, "--dim", "64", "--ffn", "64", "--layers", "1", "--heads",
               "2", "--kv-heads", "1", "--vocab", "259", "--type", "q8_0"});
    ASSERT_EQ(r.exit_code, 0) << arch << ": " << r.err;
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->config().arch->name, arch);
  }
  // The --ffn-kind spelling of each architecture's own activation and of ReLU.
  const std::string path = testing::TempDir() + "/cmd_kind.gguf";
  struct Kind {
    std::string arch, kind, activation;
    bool relu;  // written unshaped (--active-fraction 0)
  };
  for (const Kind& k :
       {Kind{"gemma2", "gelu", "gelu", false}, Kind{"falcon", "relu", "relu", true},
        Kind{"bamboo", "drelu", "drelu", false}, Kind{"starcoder2", "relu", "relu", true},
        Kind{"qwen2", "relu", "relu", true}, Kind{"qwen2", "relu-gated", "relu", true}}) {
    std::vector<std::string> args = {"-o", path, "--arch", k.arch, "--ffn-kind", k.kind};
    if (k.relu) args.insert(args.end(), {"--active-fraction", "0"});
    testing::CommandResult r = Synth(args);
    ASSERT_EQ(r.exit_code, 0) << k.arch << " " << k.kind << ": " << r.err;
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->GetString("thermocline.ffn_activation").value(), k.activation);
  }
}

TEST(SynthArchCommandTest, RefusalsNameTheArchAndFlag) {
  const std::string path = testing::TempDir() + "/refused.gguf";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--arch", "gpt2"}, "--arch 'gpt2' is not one of: llama, "},
      {{"--arch", "falcon", "--ffn-kind", "relu-gated"},
       "--ffn-kind 'relu-gated' is not one of: gelu, relu (--arch falcon"},
      {{"--arch", "llama", "--ffn-kind", "gelu"},
       "--ffn-kind 'gelu' is not one of: swiglu, relu-gated, relu (--arch llama"},
      {{"--arch", "qwen2moe", "--experts-used", "-1"}, "--experts-used -1: must be in [1, 4]"},
      {{"--arch", "gemma2", "--ffn-kind", "relu-gated"},
       "--active-fraction 0.1: the shaped ReLU design does not fit --arch gemma2"},
      {{"--arch", "gemma3", "--ffn-kind", "relu"}, "does not fit --arch gemma3: its post-sublayer"},
      {{"--arch", "olmo2", "--ffn-kind", "relu-gated"},
       "does not fit --arch olmo2: it has no ffn_norm"},
      {{"--arch", "qwen3moe", "--ffn-kind", "relu-gated"},
       "does not fit --arch qwen3moe: its FFNs are mixtures of experts"},
      {{"--arch", "llama", "--experts", "4", "--ffn-kind", "relu-gated"},
       "does not fit --arch llama: its FFNs are mixtures of experts"},
      {{"--arch", "gemma2", "--skew", "1"}, "--skew applies to --ffn-kind relu-gated only (GELU"},
      {{"--arch", "qwen2", "--experts", "4"}, "--experts 4: the qwen2 architecture has no experts"},
      {{"--arch", "llama", "--experts", "4", "--expert-ffn", "64"},
       "--expert-ffn 64: the llama architecture's experts are --ffn wide"},
      {{"--arch", "qwen2moe", "--experts", "4", "--experts-used", "5"},
       "--experts-used 5: must be in [1, 4]"},
      {{"--experts-used", "2"}, "--experts-used 2: applies to MoE models only"},
      {{"--arch", "qwen2", "--sliding-window", "8"},
       "--sliding-window 8: the qwen2 architecture has no sliding-window layers"},
      {{"--head-dim", "15"}, "--head-dim 15: must be even"},
      {{"--type", "q4_0", "--head-dim", "20", "--heads", "2", "--kv-heads", "1"},
       "--head-dim 20: times --heads 2 (attn_output's rows) must be a multiple of 32"},
      {{"--arch", "qwen2", "--ffn-kind", "relu-gated", "--powerinfer"},
       "--powerinfer: PowerInfer's layout is written for --arch llama only (not qwen2)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"-o", path};
    args.insert(args.end(), c.args.begin(), c.args.end());
    testing::CommandResult r = Synth(args);
    EXPECT_EQ(r.exit_code, 1) << c.message;
    EXPECT_TRUE(Contains(r.err, c.message)) << "stderr: " << r.err << "\nexpected: " << c.message;
  }
}

}  // namespace
}  // namespace thermocline
