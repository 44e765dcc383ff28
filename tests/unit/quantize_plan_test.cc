// PlanQuantization's per-tensor types (llama.cpp's llama_tensor_get_type without importance
// matrix): on the shared F32 source against the types of llama-quantize's own files
// (../shared/models/quants/tensor_types.txt, every mix llama.cpp wrote there), and, for the
// mixes with no llama.cpp file (Q4_1, Q5_0, Q5_1, Q2_K_S, Q3_K_L), against the lists derived
// below from llama.cpp's rules, on that source and on generated models whose layer count, head
// grouping, tied embeddings and row lengths reach the rules' other branches and the fallbacks.
#include <algorithm>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/gguf.h"
#include "shared/model/quantize.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

// "Q6_K" (tensor_types.txt, llama.cpp's log) -> q6_K (ggml's type name).
std::string GgmlName(std::string upper) {
  for (char& c : upper) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (upper.size() > 2 && upper.compare(upper.size() - 2, 2, "_k") == 0) upper.back() = 'K';
  return upper;
}

// What a model should get: token_embd, output, the per-layer types of some kinds, and `other`
// for every other matrix; norms stay f32.
struct Expected {
  std::string token_embd, output, other;
  std::map<std::string, std::vector<std::string>> by_kind;  // kind -> type of layer 0, 1, ...
};

std::vector<std::string> Layers(int n, const std::string& type) { return {size_t(n), type}; }
std::vector<std::string> Split(int first, const std::string& a, int n, const std::string& b) {
  std::vector<std::string> v = Layers(first, a);
  for (int i = first; i < n; ++i) v.push_back(b);
  return v;
}

std::string ExpectedType(const Expected& e, const std::string& name) {
  if (name == "token_embd.weight") return e.token_embd;
  if (name == "output.weight") return e.output;
  if (name.find("norm") != std::string::npos) return "F32";
  const size_t dot = name.find('.', 4);
  const int layer = std::stoi(name.substr(4, dot - 4));
  const std::string kind = name.substr(dot + 1, name.size() - dot - 1 - 7);  // drop ".weight"
  auto it = e.by_kind.find(kind);
  return it == e.by_kind.end() ? e.other : it->second.at(static_cast<size_t>(layer));
}

void ExpectPlan(const GgufFile& in, const std::string& type, bool pure, const Expected& want) {
  SCOPED_TRACE(type + (pure ? " --pure" : ""));
  auto target = QuantizeTargetFromName(type);
  ASSERT_TRUE(target.ok()) << target.status();
  auto plan = PlanQuantization(in, QuantizeOptions{*target, pure});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), in.tensors().size());
  for (const QuantizedTensor& q : *plan) {
    EXPECT_EQ(TypeTraits(q.to).name, GgmlName(ExpectedType(want, q.name))) << q.name;
  }
}

std::unique_ptr<GgufFile> OpenOrDie(const std::string& path) {
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

// tensor_types.txt: per file, "X.gguf: file_type=N counts={...} token_embd=T output=T" and then
// "    attn_k=T/T/T/T; attn_output=...; ...  (layers 0/1/2/3; norms F32)".
struct Reference {
  std::string file;
  uint32_t file_type;
  Expected types;
};

std::vector<Reference> ReadTensorTypes() {
  std::istringstream in(testing::ReadFileOrDie(testing::ModelPath("quants/tensor_types.txt")));
  std::vector<Reference> refs;
  std::string head, body;
  while (std::getline(in, head) && std::getline(in, body)) {
    Reference r;
    r.file = head.substr(0, head.find(".gguf:"));
    r.file_type = static_cast<uint32_t>(std::stoul(head.substr(head.find("file_type=") + 10)));
    auto field = [&head](const std::string& key) {
      const size_t at = head.find(" " + key + "=") + key.size() + 2;
      return head.substr(at, head.find(' ', at) - at);
    };
    r.types.token_embd = field("token_embd");
    r.types.output = field("output");
    EXPECT_NE(body.find("(layers 0/1/2/3; norms F32)"), std::string::npos) << body;
    std::istringstream kinds(body.substr(0, body.find("  (")));
    std::string item;
    while (std::getline(kinds, item, ';')) {
      item.erase(0, item.find_first_not_of(' '));
      const std::string kind = item.substr(0, item.find('='));
      std::istringstream layers(item.substr(item.find('=') + 1));
      std::string t;
      while (std::getline(layers, t, '/')) r.types.by_kind[kind].push_back(t);
      EXPECT_EQ(r.types.by_kind[kind].size(), 4u) << item;
    }
    EXPECT_EQ(r.types.by_kind.size(), 7u) << body;
    refs.push_back(std::move(r));
  }
  return refs;
}

TEST(QuantizePlanTest, SameTypesAsLlamaQuantizesFiles) {
  auto base = OpenOrDie(testing::ModelPath("quants/base-f32.gguf"));
  ASSERT_NE(base, nullptr);
  int checked = 0;
  for (const Reference& r : ReadTensorTypes()) {
    const bool pure = r.file.rfind("pure-", 0) == 0;
    const std::string type = r.file == "base-f32" ? "F32" : pure ? r.file.substr(5) : r.file;
    auto target = QuantizeTargetFromName(type);
    if (!target.ok()) {  // pure-IQ3_S, pure-IQ3_XXS: no quantizer here
      EXPECT_EQ(target.status().code(), absl::StatusCode::kUnimplemented) << r.file;
      continue;
    }
    EXPECT_EQ(target->file_type, r.file_type) << r.file;
    ExpectPlan(*base, type, pure, r.types);
    ++checked;
  }
  EXPECT_EQ(checked, 20);
}

// base-f32.gguf: 4 layers, 4 query heads over 2 KV heads (gqa 2), rows of 256 (ffn_down 768),
// an output.weight of its own. There llama.cpp's rules give:
// * Q4_1 / Q5_0 / Q5_1: no rule of theirs; output.weight q6_K (its rows fit q4_1's blocks).
// * Q2_K_S: attn_v q4_K needs gqa >= 4 (no); ffn_down q4_K for layers < 4/8 = 0 (none): all
//   q2_K but output q6_K.
// * Q3_K_L: attn_v, ffn_down, attn_output q5_K in every layer, the rest q3_K, output q6_K.
TEST(QuantizePlanTest, NewMixesOnTheSharedModel) {
  auto base = OpenOrDie(testing::ModelPath("quants/base-f32.gguf"));
  ASSERT_NE(base, nullptr);
  for (const char* t : {"Q4_1", "Q5_0", "Q5_1"}) ExpectPlan(*base, t, false, {t, "Q6_K", t, {}});
  ExpectPlan(*base, "Q2_K_S", false, {"Q2_K", "Q6_K", "Q2_K", {}});
  ExpectPlan(*base, "Q3_K_L", false,
             {"Q3_K",
              "Q6_K",
              "Q3_K",
              {{"attn_v", Layers(4, "Q5_K")},
               {"ffn_down", Layers(4, "Q5_K")},
               {"attn_output", Layers(4, "Q5_K")}}});
  for (const char* t : {"Q4_1", "Q5_0", "Q5_1", "Q2_K_S", "Q3_K_L"}) {
    auto target = QuantizeTargetFromName(t);
    ASSERT_TRUE(target.ok());
    ExpectPlan(*base, t, true,
               {std::string(TypeTraits(target->type).name),
                std::string(TypeTraits(target->type).name),
                std::string(TypeTraits(target->type).name),
                {}});
  }
}

TEST(QuantizePlanTest, FileTypeIds) {
  // llama.h's llama_ftype values.
  for (auto [name, id] : std::vector<std::pair<std::string, uint32_t>>{
           {"Q4_1", 3}, {"Q5_0", 8}, {"Q5_1", 9}, {"Q2_K_S", 21}, {"Q3_K_L", 13}, {"q3_k_l", 13}}) {
    auto target = QuantizeTargetFromName(name);
    ASSERT_TRUE(target.ok()) << name;
    EXPECT_EQ(target->file_type, id) << name;
  }
}

// A llama model with zero weights (the plan reads only names, shapes and heads).
std::unique_ptr<GgufFile> MakeModel(const std::string& name, int n_layers, int heads, int kv_heads,
                                    int64_t n_embd, int64_t n_ff, bool tied) {
  GgufWriter w;
  w.SetValue("general.architecture", GgufString("llama"));
  w.SetValue("llama.block_count", GgufU32(static_cast<uint32_t>(n_layers)));
  w.SetValue("llama.attention.head_count", GgufU32(static_cast<uint32_t>(heads)));
  w.SetValue("llama.attention.head_count_kv", GgufU32(static_cast<uint32_t>(kv_heads)));
  auto zeros = [](uint8_t* dst, int64_t n) {
    std::fill(dst, dst + n, 0);
    return absl::OkStatus();
  };
  const int64_t kv = n_embd / heads * kv_heads, vocab = 32;
  auto add = [&](const std::string& t, std::vector<int64_t> ne) {
    EXPECT_TRUE(w.AddTensor(t, GgmlType::kF32, std::move(ne), zeros).ok()) << t;
  };
  add("token_embd.weight", {n_embd, vocab});
  for (int l = 0; l < n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {n_embd});
    add(p + "attn_q.weight", {n_embd, n_embd});
    add(p + "attn_k.weight", {n_embd, kv});
    add(p + "attn_v.weight", {n_embd, kv});
    add(p + "attn_output.weight", {n_embd, n_embd});
    add(p + "ffn_norm.weight", {n_embd});
    add(p + "ffn_gate.weight", {n_embd, n_ff});
    add(p + "ffn_up.weight", {n_embd, n_ff});
    add(p + "ffn_down.weight", {n_ff, n_embd});
  }
  add("output_norm.weight", {n_embd});
  if (!tied) add("output.weight", {n_embd, vocab});
  const std::string path = testing::TempDir() + "/" + name + ".gguf";
  EXPECT_TRUE(w.WriteFile(path).ok());
  return OpenOrDie(path);
}

// 16 layers, 8 query heads over 2 KV heads (gqa 4):
// * Q2_K_S: attn_v q4_K (gqa >= 4) in every layer; ffn_down q4_K in layers < 16/8 = 2.
// * Q3_K_L: as on the shared model, every layer.
// * Q3_K_M (a mix with llama.cpp files, here at a depth they do not reach): attn_v q5_K in
//   layers < 2 then q4_K; ffn_down q5_K in layers < 16/16 = 1 then q4_K; attn_output q4_K.
// * Q4_1: every matrix q4_1, output q6_K.
TEST(QuantizePlanTest, LayerRulesOfADeeperModel) {
  auto m = MakeModel("plan_deep", 16, 8, 2, 256, 512, false);
  ASSERT_NE(m, nullptr);
  ExpectPlan(*m, "Q2_K_S", false,
             {"Q2_K",
              "Q6_K",
              "Q2_K",
              {{"attn_v", Layers(16, "Q4_K")}, {"ffn_down", Split(2, "Q4_K", 16, "Q2_K")}}});
  ExpectPlan(*m, "Q3_K_L", false,
             {"Q3_K",
              "Q6_K",
              "Q3_K",
              {{"attn_v", Layers(16, "Q5_K")},
               {"ffn_down", Layers(16, "Q5_K")},
               {"attn_output", Layers(16, "Q5_K")}}});
  ExpectPlan(*m, "Q3_K_M", false,
             {"Q3_K",
              "Q6_K",
              "Q3_K",
              {{"attn_v", Split(2, "Q5_K", 16, "Q4_K")},
               {"ffn_down", Split(1, "Q5_K", 16, "Q4_K")},
               {"attn_output", Layers(16, "Q4_K")}}});
  ExpectPlan(*m, "Q4_1", false, {"Q4_1", "Q6_K", "Q4_1", {}});
}

// 2 layers, no output.weight (token_embd is the output, so it gets output.weight's type), and
// ffn_down rows of 96 = 3 blocks of 32 but no super-block of 256. llama.cpp's fallbacks:
// q2_K -> iq4_nl, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0; the 32-element types fit as they are.
TEST(QuantizePlanTest, TiedEmbeddingsAndFallbacks) {
  auto m = MakeModel("plan_tied", 2, 4, 4, 256, 96, true);
  ASSERT_NE(m, nullptr);
  ExpectPlan(*m, "Q3_K_L", false,
             {"Q6_K",
              "-",
              "Q3_K",
              {{"attn_v", Layers(2, "Q5_K")},
               {"ffn_down", Layers(2, "Q5_1")},
               {"attn_output", Layers(2, "Q5_K")}}});
  ExpectPlan(*m, "Q2_K_S", false, {"Q6_K", "-", "Q2_K", {{"ffn_down", Layers(2, "IQ4_NL")}}});
  ExpectPlan(
      *m, "Q4_K_S", false,
      {"Q6_K", "-", "Q4_K", {{"attn_v", Layers(2, "Q5_K")}, {"ffn_down", Layers(2, "Q5_0")}}});
  ExpectPlan(*m, "Q6_K", false, {"Q6_K", "-", "Q6_K", {{"ffn_down", Layers(2, "Q8_0")}}});
  ExpectPlan(*m, "Q5_0", false, {"Q6_K", "-", "Q5_0", {}});
  // --pure has no fallback (llama.cpp does not run the rules): q4_K rows must fit.
  auto target = QuantizeTargetFromName("Q4_K_M");
  ASSERT_TRUE(target.ok());
  auto plan = PlanQuantization(*m, QuantizeOptions{*target, true});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("blk.0.ffn_down.weight': rows of 96 do not fit q4_K"),
            std::string::npos)
      << plan.status();
}

// Rows of 96 everywhere but ffn_down (48: not even one more block of 32). The output's rows do
// not fit q3_K's blocks, so it is q8_0; the q3_K matrices fall back to iq4_nl, the q5_K ones to
// q5_1, and ffn_down, fitting neither, to f16. A q4_1 target has no fallback: refused.
TEST(QuantizePlanTest, RowsThatFitNoBlock) {
  auto m = MakeModel("plan_narrow", 2, 4, 4, 96, 48, false);
  ASSERT_NE(m, nullptr);
  ExpectPlan(*m, "Q3_K_L", false,
             {"IQ4_NL",
              "Q8_0",
              "IQ4_NL",
              {{"attn_v", Layers(2, "Q5_1")},
               {"ffn_down", Layers(2, "F16")},
               {"attn_output", Layers(2, "Q5_1")}}});
  auto target = QuantizeTargetFromName("Q4_1");
  ASSERT_TRUE(target.ok());
  auto plan = PlanQuantization(*m, QuantizeOptions{*target, false});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("blk.0.ffn_down.weight': rows of 48 do not fit q4_1"),
            std::string::npos)
      << plan.status();
}

}  // namespace
}  // namespace thermocline
