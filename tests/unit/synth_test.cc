#include "shared/model/synth.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/gguf/quant.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<float> Dequantized(const GgufTensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements));
  const int64_t ne0 = t.ne[0];
  const int64_t rows = t.n_elements / ne0;
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(t.type, t.data + r * RowBytes(t.type, ne0), out.data() + r * ne0, ne0);
  }
  return out;
}

TEST(SynthVocabTest, ByteLevelLayout) {
  SynthVocab v = MakeSynthVocab(512);
  ASSERT_EQ(v.tokens.size(), 512u);
  ASSERT_EQ(v.scores.size(), 512u);
  ASSERT_EQ(v.types.size(), 512u);
  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.types[0], 2);
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.types[1], 3);
  EXPECT_EQ(v.tokens[2], "</s>");
  EXPECT_EQ(v.types[2], 3);
  EXPECT_EQ(v.tokens[3], "<0x00>");
  EXPECT_EQ(v.tokens[3 + 0x41], "<0x41>");
  EXPECT_EQ(v.tokens[258], "<0xFF>");
  for (int i = 3; i < 259; ++i) EXPECT_EQ(v.types[i], 6) << i;
  EXPECT_EQ(v.tokens[259], "▁");
  EXPECT_EQ(v.types[259], 1);

  absl::flat_hash_set<std::string> seen;
  for (const std::string& t : v.tokens) EXPECT_TRUE(seen.insert(t).second) << "duplicate " << t;
  EXPECT_TRUE(seen.contains("▁the"));
  EXPECT_TRUE(seen.contains("▁a"));
  EXPECT_TRUE(seen.contains("e"));
  // Every normal piece can be built by merging: its prefix (one character shorter) is present,
  // and earlier (shorter, commoner) pieces score higher.
  float prev_score = 1.0f;
  for (size_t i = 259; i < v.tokens.size(); ++i) {
    if (v.types[i] != 1) break;
    EXPECT_LT(v.scores[i], prev_score) << v.tokens[i];
    prev_score = v.scores[i];
    const std::string& t = v.tokens[i];
    size_t cut = t.size() - 1;
    while (cut > 0 && (static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) --cut;
    if (cut > 0) {
      EXPECT_TRUE(seen.contains(t.substr(0, cut))) << t;
    }
  }
}

TEST(SynthVocabTest, SmallAndLargeVocabularies) {
  SynthVocab bytes_only = MakeSynthVocab(259);
  ASSERT_EQ(bytes_only.tokens.size(), 259u);
  EXPECT_EQ(bytes_only.tokens.back(), "<0xFF>");
  SynthVocab big = MakeSynthVocab(32000);
  ASSERT_EQ(big.tokens.size(), 32000u);
  EXPECT_EQ(big.tokens[31999], "<unused_31999>");
  EXPECT_EQ(big.types[31999], 5);
  int normal = 0;
  for (int32_t t : big.types) normal += t == 1;
  EXPECT_GT(normal, 300);
}

TEST(SynthWeightsTest, CounterBasedAndScaled) {
  const int64_t fan_in = 256, n = 256 * 64;
  std::vector<float> whole(n), parts(n);
  SynthWeights(SynthRole::kFfnUp, 7, 3, fan_in, 0, n, whole.data());
  SynthWeights(SynthRole::kFfnUp, 7, 3, fan_in, 0, 1000, parts.data());
  SynthWeights(SynthRole::kFfnUp, 7, 3, fan_in, 1000, n, parts.data() + 1000);
  EXPECT_EQ(whole, parts);
  double sum = 0, sum_sq = 0;
  for (float x : whole) {
    sum += x;
    sum_sq += double(x) * x;
  }
  const double mean = sum / n, std = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01 / std::sqrt(fan_in) * 10);
  EXPECT_NEAR(std, 1.0 / std::sqrt(fan_in), 0.02 / std::sqrt(fan_in));
  // Other seeds and other tensors give other values.
  std::vector<float> other(100);
  SynthWeights(SynthRole::kFfnUp, 8, 3, fan_in, 0, 100, other.data());
  EXPECT_NE(std::vector<float>(whole.begin(), whole.begin() + 100), other);
  SynthWeights(SynthRole::kFfnUp, 7, 4, fan_in, 0, 100, other.data());
  EXPECT_NE(std::vector<float>(whole.begin(), whole.begin() + 100), other);
  // Norms are ones.
  SynthWeights(SynthRole::kNorm, 7, 0, 64, 0, 64, other.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(other[i], 1.0f);
}

TEST(SynthLibraryTest, SameBytesForAnyThreadCount) {
  SynthOptions o;
  o.dim = 64;
  o.ffn = 96;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 300;
  o.context = 64;
  o.type = GgmlType::kQ4_0;
  const std::string dir = testing::TempDir();
  o.threads = 1;
  ASSERT_TRUE(WriteSynthModel(o, dir + "/t1.gguf").ok());
  o.threads = 3;
  ASSERT_TRUE(WriteSynthModel(o, dir + "/t3.gguf").ok());
  EXPECT_EQ(testing::ReadFileOrDie(dir + "/t1.gguf"), testing::ReadFileOrDie(dir + "/t3.gguf"));
}

TEST(SynthLibraryTest, ProgressReachesTotal) {
  SynthOptions o;
  o.dim = 64;
  o.ffn = 64;
  o.layers = 1;
  o.heads = 2;
  o.kv_heads = 1;
  o.vocab = 259;
  int64_t last_done = -1, last_total = -1;
  int calls = 0;
  o.progress = [&](int64_t done, int64_t total) {
    EXPECT_GT(done, last_done);
    last_done = done;
    last_total = total;
    ++calls;
  };
  ASSERT_TRUE(WriteSynthModel(o, testing::TempDir() + "/p.gguf").ok());
  EXPECT_EQ(calls, 3 + 9);
  EXPECT_EQ(last_done, last_total);
}

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

TEST(SynthDesignTest, ThresholdsAverageToTheActiveFraction) {
  for (double f : {0.05, 0.1, 0.2}) {
    for (double skew : {0.0, 1.25, 2.0}) {
      SynthOptions o;
      o.ffn_kind = SynthFfnKind::kReluGated;
      o.ffn = 20000;
      o.active_fraction = f;
      o.skew = skew;
      const SynthSparsityDesign d = DesignSynthSparsity(o);
      ASSERT_TRUE(d.enabled);
      const std::vector<float> t = SynthNeuronThresholds(o, d, 1);
      ASSERT_EQ(t.size(), 20000u);
      double mean_p = 0, mean_t = 0;
      for (float x : t) {
        mean_p += NormalCdf(-x);
        mean_t += x;
      }
      mean_p /= t.size();
      mean_t /= t.size();
      // A neuron with threshold t fires with probability Phi(-t); the thresholds' mean and
      // spread are set so that these average to the active fraction.
      EXPECT_NEAR(mean_p, f, 0.06 * f) << f << " " << skew;
      EXPECT_NEAR(mean_t, d.threshold_mean, 0.05) << f << " " << skew;
      // Another layer draws other thresholds (skew 0 gives every neuron the mean).
      if (skew > 0) {
        EXPECT_NE(t, SynthNeuronThresholds(o, d, 2));
      } else {
        EXPECT_EQ(t, std::vector<float>(t.size(), static_cast<float>(d.threshold_mean)));
      }
    }
  }
}

TEST(SynthDesignTest, OnlyShapedReluModels) {
  SynthOptions o;
  EXPECT_FALSE(DesignSynthSparsity(o).enabled);  // SwiGLU
  o.ffn_kind = SynthFfnKind::kReluGated;
  o.active_fraction = 0;
  EXPECT_FALSE(DesignSynthSparsity(o).enabled);
  o.active_fraction = 0.1;
  const SynthSparsityDesign d = DesignSynthSparsity(o);
  ASSERT_TRUE(d.enabled);
  EXPECT_GE(d.persistent_dim, 0);
  EXPECT_LT(d.persistent_dim, o.dim);
  EXPECT_EQ(d.basis_rank, o.dim / 16);
  EXPECT_EQ(d.predictor_rank(), 2 * d.basis_rank + 1);
  EXPECT_NEAR(d.predictor_recall, 0.985, 1e-3);
  EXPECT_GT(d.predictor_margin, 0);
  ASSERT_EQ(static_cast<int64_t>(d.residual_rms.size()), o.layers);
  for (size_t l = 1; l < d.residual_rms.size(); ++l) {
    EXPECT_GT(d.residual_rms[l], d.residual_rms[l - 1]);
  }
  EXPECT_NEAR(d.residual_rms[0], 1.04, 0.01);
}

// The construction as the file holds it (docs/synthetic-models.md).
TEST(SynthDesignTest, ShapedWeights) {
  SynthOptions o;
  o.ffn_kind = SynthFfnKind::kReluGated;
  o.dim = 128;
  o.ffn = 256;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 300;
  const std::string path = testing::TempDir() + "/shaped.gguf";
  ASSERT_TRUE(WriteSynthModel(o, path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  const SynthSparsityDesign d = DesignSynthSparsity(o);
  const int64_t k = d.persistent_dim, dim = o.dim;
  EXPECT_EQ(g.GetInt("thermocline.synth.persistent_dim").value(), k);
  EXPECT_NEAR(g.GetDouble("thermocline.synth.active_fraction").value(), 0.1, 1e-7);
  EXPECT_NEAR(g.GetDouble("thermocline.synth.skew").value(), 1.25, 1e-7);
  const std::vector<float> embd = Dequantized(*g.FindTensor("token_embd.weight"));
  for (int64_t v = 0; v < o.vocab; ++v) ASSERT_EQ(embd[v * dim + k], d.persistent_value) << v;
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const std::vector<float> wo = Dequantized(*g.FindTensor(p + "attn_output.weight"));
    const std::vector<float> down = Dequantized(*g.FindTensor(p + "ffn_down.weight"));
    for (int64_t j = 0; j < dim; ++j) ASSERT_EQ(wo[k * dim + j], 0.0f);
    for (int64_t i = 0; i < o.ffn; ++i) ASSERT_EQ(down[k * o.ffn + i], 0.0f);
    const std::vector<float> norm = Dequantized(*g.FindTensor(p + "ffn_norm.weight"));
    for (int64_t j = 0; j < dim; ++j) {
      const double want = j == k ? d.gate_scale * d.residual_rms[l] / d.persistent_value : 1.0;
      ASSERT_NEAR(norm[j], want, 1e-4 * want) << j;
    }
    const std::vector<float> up = Dequantized(*g.FindTensor(p + "ffn_up.weight"));
    const std::vector<float> gate = Dequantized(*g.FindTensor(p + "ffn_gate.weight"));
    const std::vector<float> t = SynthNeuronThresholds(o, d, l);
    double sum_sq = 0;
    for (int64_t i = 0; i < o.ffn; ++i) {
      ASSERT_EQ(up[i * dim + k], 0.0f);
      ASSERT_FLOAT_EQ(gate[i * dim + k], static_cast<float>(-t[i] / d.gate_scale));
      for (int64_t j = 0; j < dim; ++j) {
        if (j != k) sum_sq += double(gate[i * dim + j]) * gate[i * dim + j];
      }
    }
    // Off the persistent coordinate each gate row has about unit norm, so its token term is
    // about N(0, 1) against the threshold.
    EXPECT_NEAR(sum_sq / o.ffn, 1.0, 0.05);
  }
}

// ---------------------------------------------------------------------------------------------
// The command.

testing::CommandResult Synth(std::vector<std::string> args) {
  args.insert(args.begin(), {testing::BinDir() + "/thermocline", "synth"});
  return testing::RunCommand(args);
}

const std::vector<std::string> kSmall = {"--dim",     "64", "--ffn",      "128", "--layers", "2",
                                         "--heads",   "4",  "--kv-heads", "2",   "--vocab",  "300",
                                         "--context", "96"};

std::vector<std::string> SmallArgs(const std::string& path, const std::string& type) {
  std::vector<std::string> args = {"-o", path, "--type", type};
  args.insert(args.end(), kSmall.begin(), kSmall.end());
  return args;
}

TEST(SynthCommandTest, EveryTypeParsesWithExpectedKeysAndShapes) {
  const std::string dir = testing::TempDir();
  std::vector<float> f32_attn_q;
  // llama.cpp's enum llama_ftype.
  const std::vector<std::pair<const char*, int>> types = {
      {"f32", 0}, {"f16", 1}, {"bf16", 32}, {"q8_0", 7}, {"q4_0", 2}};
  for (const auto& [type_name, file_type] : types) {
    SCOPED_TRACE(type_name);
    const std::string path = dir + "/" + std::string(type_name) + ".gguf";
    testing::CommandResult r = Synth(SmallArgs(path, type_name));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    const GgufFile& g = **f;
    const GgmlType type = *TypeFromName(type_name);
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.GetString("general.architecture").value(), "llama");
    EXPECT_TRUE(g.GetString("general.name").ok());
    EXPECT_EQ(g.GetInt("general.file_type").value(), file_type);
    EXPECT_EQ(g.GetInt("llama.context_length").value(), 96);
    EXPECT_EQ(g.GetInt("llama.embedding_length").value(), 64);
    EXPECT_EQ(g.GetInt("llama.feed_forward_length").value(), 128);
    EXPECT_EQ(g.GetInt("llama.block_count").value(), 2);
    EXPECT_EQ(g.GetInt("llama.attention.head_count").value(), 4);
    EXPECT_EQ(g.GetInt("llama.attention.head_count_kv").value(), 2);
    EXPECT_EQ(g.GetInt("llama.rope.dimension_count").value(), 16);
    EXPECT_NEAR(g.GetDouble("llama.attention.layer_norm_rms_epsilon").value(), 1e-5, 1e-12);
    EXPECT_EQ(g.GetDouble("llama.rope.freq_base").value(), 10000.0);
    EXPECT_EQ(g.GetString("thermocline.ffn_activation").value(), "silu");
    EXPECT_EQ(g.GetString("tokenizer.ggml.model").value(), "llama");
    EXPECT_EQ(g.GetArray("tokenizer.ggml.tokens").value()->items.size(), 300u);
    EXPECT_EQ(g.GetArray("tokenizer.ggml.scores").value()->items.size(), 300u);
    EXPECT_EQ(g.GetArray("tokenizer.ggml.token_type").value()->items.size(), 300u);
    EXPECT_EQ(g.GetInt("tokenizer.ggml.bos_token_id").value(), 1);
    EXPECT_EQ(g.GetInt("tokenizer.ggml.eos_token_id").value(), 2);
    EXPECT_EQ(g.GetInt("tokenizer.ggml.unknown_token_id").value(), 0);

    ASSERT_EQ(g.tensors().size(), 3u + 2 * 9);
    struct Expect {
      std::string name;
      std::vector<int64_t> ne;
      bool norm;
    };
    std::vector<Expect> expected = {{"token_embd.weight", {64, 300}, false},
                                    {"output_norm.weight", {64}, true},
                                    {"output.weight", {64, 300}, false}};
    for (int l = 0; l < 2; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      expected.push_back({p + "attn_norm.weight", {64}, true});
      expected.push_back({p + "attn_q.weight", {64, 64}, false});
      expected.push_back({p + "attn_k.weight", {64, 32}, false});
      expected.push_back({p + "attn_v.weight", {64, 32}, false});
      expected.push_back({p + "attn_output.weight", {64, 64}, false});
      expected.push_back({p + "ffn_norm.weight", {64}, true});
      expected.push_back({p + "ffn_gate.weight", {64, 128}, false});
      expected.push_back({p + "ffn_up.weight", {64, 128}, false});
      expected.push_back({p + "ffn_down.weight", {128, 64}, false});
    }
    for (const Expect& e : expected) {
      const GgufTensorInfo* t = g.FindTensor(e.name);
      ASSERT_NE(t, nullptr) << e.name;
      EXPECT_EQ(t->ne, e.ne) << e.name;
      EXPECT_EQ(t->type, e.norm ? GgmlType::kF32 : type) << e.name;
      if (e.norm) {
        for (float x : Dequantized(*t)) ASSERT_EQ(x, 1.0f) << e.name;
      }
    }
    // Every type holds the same underlying weights, up to its rounding.
    std::vector<float> q = Dequantized(*g.FindTensor("blk.1.attn_q.weight"));
    if (type == GgmlType::kF32) {
      f32_attn_q = q;
      double sum_sq = 0;
      for (float x : q) sum_sq += double(x) * x;
      EXPECT_NEAR(std::sqrt(sum_sq / q.size()), 1.0 / 8, 0.01);  // 1/sqrt(fan_in 64)
    } else {
      ASSERT_EQ(q.size(), f32_attn_q.size());
      const float tol = type == GgmlType::kQ4_0 ? 0.06f : 0.01f;
      for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(q[i], f32_attn_q[i], tol) << i;
    }
  }
}

TEST(SynthCommandTest, DeterministicAndSeeded) {
  const std::string dir = testing::TempDir();
  auto args = SmallArgs(dir + "/a.gguf", "q8_0");
  args.insert(args.end(), {"--ffn-kind", "relu-gated", "--seed", "42"});
  ASSERT_EQ(Synth(args).exit_code, 0);
  args[1] = dir + "/b.gguf";
  ASSERT_EQ(Synth(args).exit_code, 0);
  args[1] = dir + "/c.gguf";
  args.back() = "43";
  ASSERT_EQ(Synth(args).exit_code, 0);
  const std::string a = testing::ReadFileOrDie(dir + "/a.gguf");
  EXPECT_EQ(a, testing::ReadFileOrDie(dir + "/b.gguf"));
  EXPECT_NE(a, testing::ReadFileOrDie(dir + "/c.gguf"));
  auto f = GgufFile::Open(dir + "/a.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->GetString("thermocline.ffn_activation").value(), "relu");
}

TEST(SynthCommandTest, DefaultsWork) {
  const std::string path = testing::TempDir() + "/default.gguf";
  testing::CommandResult r = Synth({"-o", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->GetInt("llama.embedding_length").value(), 256);
  EXPECT_EQ((*f)->GetInt("llama.block_count").value(), 4);
  EXPECT_EQ((*f)->GetInt("llama.attention.head_count_kv").value(), 4);
  EXPECT_EQ((*f)->FindTensor("token_embd.weight")->type, GgmlType::kF32);
  EXPECT_EQ((*f)->GetArray("tokenizer.ggml.tokens").value()->items.size(), 512u);
}

TEST(SynthCommandTest, BadFlagsAreRejected) {
  const std::string path = testing::TempDir() + "/bad.gguf";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--dim", "100", "--heads", "8"}, "--dim 100: must be divisible by --heads 8"},
      {{"--heads", "8", "--kv-heads", "3"}, "--heads 8: must be divisible by --kv-heads 3"},
      {{"--heads", "4", "--kv-heads", "8"}, "--kv-heads 8: must be in [1, 4]"},
      {{"--dim", "96", "--heads", "32", "--kv-heads", "4"}, "odd head dimension 3"},
      {{"--type", "q8_0", "--dim", "80", "--heads", "4", "--kv-heads", "4"},
       "--dim 80: must be a multiple of 32 for --type q8_0"},
      {{"--type", "q4_0", "--ffn", "688"}, "--ffn 688: must be a multiple of 32 for --type q4_0"},
      {{"--vocab", "100"}, "--vocab 100: must be in [259,"},
      {{"--layers", "0"}, "--layers 0: must be in [1, 1024]"},
      {{"--context", "0"}, "--context 0: must be in [1,"},
      {{"--type", "iq3_s"}, "--type 'iq3_s' is not one of: f32, f16, bf16, q8_0, q4_0"},
      {{"--type", "i32"}, "--type 'i32' is not one of: f32, f16, bf16, q8_0, q4_0"},
      {{"--ffn-kind", "gelu"}, "--ffn-kind 'gelu' is not one of: swiglu, relu-gated"},
      {{"--ffn-kind", "relu-gated", "--active-fraction", "1"},
       "--active-fraction 1: must be in [0, 1)"},
      {{"--ffn-kind", "relu-gated", "--active-fraction", "-0.1"},
       "--active-fraction -0.1: must be in [0, 1)"},
      {{"--ffn-kind", "relu-gated", "--skew", "5"}, "--skew 5: must be in [0, 4]"},
      {{"--active-fraction", "0.2"}, "--active-fraction applies to --ffn-kind relu-gated only"},
      {{"--skew", "1"}, "--skew applies to --ffn-kind relu-gated only"},
      {{"--powerinfer"}, "PowerInfer runs ReLU models only"},
      {{"--ffn-kind", "relu-gated", "--active-fraction", "0", "--powerinfer"},
       "the predictors need a shaped model (--active-fraction > 0)"},
      {{"--ffn-kind", "relu-gated", "--powerinfer-output", path},
       "--powerinfer-output must differ from -o"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"-o", path};
    args.insert(args.end(), c.args.begin(), c.args.end());
    testing::CommandResult r = Synth(args);
    EXPECT_EQ(r.exit_code, 1) << c.message;
    EXPECT_TRUE(Contains(r.err, c.message)) << "stderr: " << r.err << "\nexpected: " << c.message;
  }
  EXPECT_FALSE(std::ifstream(path).good());
  // Option syntax errors come from the option parser (exit 2).
  EXPECT_EQ(Synth({"--dim", "64"}).exit_code, 2);  // no -o
  EXPECT_EQ(Synth({"-o", path, "--dim", "abc"}).exit_code, 2);
  EXPECT_EQ(Synth({"--help"}).exit_code, 0);
}

TEST(SynthCommandTest, PowerInferFileBeside) {
  const std::string dir = testing::TempDir();
  auto args = SmallArgs(dir + "/pi.gguf", "f16");
  args.insert(args.end(), {"--ffn-kind", "relu-gated", "--powerinfer"});
  testing::CommandResult r = Synth(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.err, "wrote " + dir + "/pi.powerinfer.gguf")) << r.err;
  auto f = GgufFile::Open(dir + "/pi.powerinfer.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->is_powerinfer());
  EXPECT_NE((*f)->FindTensor("blk.1.ffn_down_t.weight"), nullptr);
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_down.weight"), nullptr);
  EXPECT_NE((*f)->FindTensor("blk.1.fc1.weight"), nullptr);
  EXPECT_NE((*f)->FindTensor("blk.1.fc2.weight"), nullptr);
  auto plain = GgufFile::Open(dir + "/pi.gguf");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE((*plain)->is_powerinfer());

  // An explicit path, and an output without the .gguf extension.
  args = SmallArgs(dir + "/model", "f32");
  args.insert(args.end(), {"--ffn-kind", "relu-gated", "--powerinfer"});
  ASSERT_EQ(Synth(args).exit_code, 0);
  EXPECT_TRUE(std::ifstream(dir + "/model.powerinfer.gguf").good());
  args = SmallArgs(dir + "/x.gguf", "f32");
  args.insert(args.end(), {"--ffn-kind", "relu-gated", "--powerinfer-output", dir + "/pi2.gguf"});
  ASSERT_EQ(Synth(args).exit_code, 0);
  EXPECT_TRUE(std::ifstream(dir + "/pi2.gguf").good());
  EXPECT_FALSE(std::ifstream(dir + "/x.powerinfer.gguf").good());
}

TEST(InfoCommandTest, PrintsStories260K) {
  testing::CommandResult r =
      testing::RunCommand({testing::BinDir() + "/thermocline", "info",
                           testing::ModelPath("stories260K/stories260K.gguf")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "version:     3"));
  EXPECT_TRUE(Contains(r.out, "metadata: 19 keys"));
  EXPECT_TRUE(Contains(r.out, "tokenizer.ggml.tokens"));
  EXPECT_TRUE(Contains(r.out, "array[string] (512) [\"<unk>\", \"<s>\""));
  EXPECT_TRUE(Contains(r.out, "llama.attention.layer_norm_rms_epsilon  float32 1e-05"));
  EXPECT_TRUE(Contains(r.out, "tensors: 48"));
  EXPECT_TRUE(Contains(r.out, "(64, 512)"));
  EXPECT_TRUE(Contains(r.out, "total: 48 tensors"));
}

TEST(InfoCommandTest, ErrorsGoToStderr) {
  const std::string bin = testing::BinDir() + "/thermocline";
  testing::CommandResult r = testing::RunCommand({bin, "info", "/nonexistent/m.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "thermocline info: gguf: /nonexistent/m.gguf: cannot open")) << r.err;
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(testing::RunCommand({bin, "info", "--help"}).exit_code, 0);
}

}  // namespace
}  // namespace thermocline
