// `thermocline quantize` on the shared F32 source (../shared/models/quants/base-f32.gguf)
// against the files llama.cpp's llama-quantize wrote from it: every tensor's type, shape and
// bytes, compared one by one, and the file type recorded.
#include "shared/model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::BinDir;
using testing::ModelPath;
using testing::RunCommand;

std::string Thermocline() { return BinDir() + "/thermocline"; }

struct Case {
  const char* type;
  bool pure;
  const char* reference;  // under models/quants/
};

TEST(QuantizeTest, SameTensorBytesAsLlamaQuantize) {
  for (const Case& c :
       {Case{"Q8_0", false, "Q8_0.gguf"}, Case{"Q4_0", true, "pure-Q4_0.gguf"},
        Case{"Q6_K", false, "Q6_K.gguf"}, Case{"Q4_0", false, "Q4_0.gguf"},
        Case{"Q4_K_M", false, "Q4_K_M.gguf"}, Case{"Q4_K", true, "pure-Q4_K.gguf"},
        Case{"Q4_K_S", false, "Q4_K_S.gguf"}, Case{"Q5_K_M", false, "Q5_K_M.gguf"},
        Case{"Q5_K_S", false, "Q5_K_S.gguf"}, Case{"Q5_K", true, "pure-Q5_K.gguf"},
        Case{"Q3_K_S", false, "Q3_K_S.gguf"}, Case{"Q3_K_M", false, "Q3_K_M.gguf"},
        Case{"Q3_K", true, "pure-Q3_K.gguf"}, Case{"Q2_K", false, "Q2_K.gguf"},
        Case{"Q2_K", true, "pure-Q2_K.gguf"}, Case{"IQ4_NL", false, "IQ4_NL.gguf"},
        Case{"IQ4_NL", true, "pure-IQ4_NL.gguf"}, Case{"IQ4_XS", false, "IQ4_XS.gguf"},
        Case{"IQ4_XS", true, "pure-IQ4_XS.gguf"}}) {
    SCOPED_TRACE(c.reference);
    const std::string out = testing::TempDir() + "/" + c.reference;
    std::vector<std::string> argv = {Thermocline(), "quantize", ModelPath("quants/base-f32.gguf"),
                                     out,           "--type",   c.type};
    if (c.pure) argv.push_back("--pure");
    auto r = RunCommand(argv);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto ours = GgufFile::Open(out);
    ASSERT_TRUE(ours.ok()) << ours.status();
    auto ref = GgufFile::Open(ModelPath(std::string("quants/") + c.reference));
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_EQ((*ours)->tensors().size(), (*ref)->tensors().size());
    int differ = 0;
    for (const GgufTensorInfo& want : (*ref)->tensors()) {
      const GgufTensorInfo* got = (*ours)->FindTensor(want.name);
      ASSERT_NE(got, nullptr) << want.name;
      EXPECT_EQ(got->type, want.type) << want.name;
      EXPECT_EQ(got->ne, want.ne) << want.name;
      ASSERT_EQ(got->n_bytes, want.n_bytes) << want.name;
      if (std::memcmp(got->data, want.data, static_cast<size_t>(want.n_bytes)) != 0) {
        ++differ;
        ADD_FAILURE() << want.name << ": bytes differ from llama-quantize's";
      }
    }
    EXPECT_EQ(differ, 0);
    EXPECT_EQ(*(*ours)->GetInt("general.file_type"), *(*ref)->GetInt("general.file_type"));
    EXPECT_EQ(*(*ours)->GetInt("general.quantization_version"), 2);
    // Every other key is carried over with its value's type (the tokenizer included).
    for (const auto& [key, value] : (*ref)->metadata()) {
      const GgufValue* v = (*ours)->FindValue(key);
      ASSERT_NE(v, nullptr) << key;
      EXPECT_EQ(v->type(), value.type()) << key;
    }
  }
}

// The prompt's logits (ids32.txt, every position) of a model file, dense CPU engine, F32 KV.
std::vector<float> PromptLogits(const std::string& path) {
  std::istringstream in(testing::ReadFileOrDie(ModelPath("quants/ids32.txt")));
  std::vector<BatchEntry> batch;
  for (int32_t id, p = 0; in >> id; ++p) batch.push_back({0, p, id, true});
  auto model = Model::Load(path);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto kv = KvCache::Create((*model)->config(), 1, 64, GgmlType::kF32);
  EXPECT_TRUE(kv.ok()) << kv.status();
  ThreadPool pool(2);
  ForwardPass pass(**model, *kv, pool);
  std::vector<float> logits;
  EXPECT_TRUE(pass.Run(batch, logits).ok());
  return logits;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

float RmsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += double(a[i] - b[i]) * (a[i] - b[i]);
  return static_cast<float>(std::sqrt(sum / std::max<size_t>(1, a.size())));
}

// The five targets llama.cpp has no file of here (Q4_1, Q5_0, Q5_1, Q2_K_S, Q3_K_L;
// tests/unit/legacy_quant_test.cc checks their blocks, tests/unit/quantize_plan_test.cc their
// mixes): the written file has the plan's types and llama.cpp's file type, loads, generates, and
// its logits stay near the F32 model's (llama.cpp's base-f32.logits.f32).
//
// The bound is not derived from first principles but from llama.cpp's own files of the same
// model: quantization noise of random weights moves the prompt's 32 x 512 logits (|logit| <=
// ~3) by an RMS that grows with the step size (llama.cpp's files against base-f32.logits.f32:
// Q8_0 0.013, Q5_K_S 0.063, Q4_0 0.131, Q3_K_M 0.184, Q2_K 0.381, pure-Q2_K 0.475; their max
// differences are 5x that and noisier, so the RMS is compared). Each new file is held to the
// llama.cpp file it cannot be worse than by construction, with a margin for noise:
// * Q4_1: 4 bits with a min, a step (max - min) / 15 of at most 16/15 of q4_0's amax / 8:
//   within 1.25x Q4_0's RMS.
// * Q5_0 / Q5_1: 5 bits, about half q4_0's step: within 0.75x Q4_0's RMS, and below Q4_1's own.
// * Q2_K_S: here the q2_K blocks of pure-Q2_K (the same quantizer, bit for bit) with a q6_K
//   output: within 1.1x pure-Q2_K's RMS.
// * Q3_K_L: at least Q3_K_M's bits in every tensor (q5_K for its q4_K attn_v, ffn_down,
//   attn_output): within Q3_K_M's RMS.
// A mis-scaled or mis-packed block shows as an error of the order of the logits themselves.
TEST(QuantizeTest, TargetsWithoutALlamaCppFileRunNearF32) {
  const std::vector<float> f32 = testing::ReadF32File(ModelPath("quants/base-f32.logits.f32"));
  auto reference_rms = [&f32](const char* file) {
    const std::vector<float> ref =
        testing::ReadF32File(ModelPath(std::string("quants/") + file + ".logits.f32"));
    const float d = RmsDiff(ref, f32);
    std::printf("llama.cpp %s: prompt RMS(logit - F32 logit) = %.4f, max %.3g\n", file, d,
                MaxDiff(ref, f32));
    return d;
  };
  const float q4_0 = reference_rms("Q4_0"), pure_q2_k = reference_rms("pure-Q2_K"),
              q3_k_m = reference_rms("Q3_K_M");
  struct Target {
    const char* type;
    uint32_t file_type;
    float bound;
  };
  std::map<std::string, float> rms;
  for (const Target& t : {Target{"Q4_1", 3, 1.25f * q4_0}, Target{"Q5_0", 8, 0.75f * q4_0},
                          Target{"Q5_1", 9, 0.75f * q4_0}, Target{"Q2_K_S", 21, 1.1f * pure_q2_k},
                          Target{"Q3_K_L", 13, q3_k_m}}) {
    SCOPED_TRACE(t.type);
    const std::string out = testing::TempDir() + "/new-" + t.type + ".gguf";
    auto r = RunCommand(
        {Thermocline(), "quantize", ModelPath("quants/base-f32.gguf"), out, "--type", t.type});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto base = GgufFile::Open(ModelPath("quants/base-f32.gguf"));
    ASSERT_TRUE(base.ok()) << base.status();
    auto target = QuantizeTargetFromName(t.type);
    ASSERT_TRUE(target.ok());
    auto plan = PlanQuantization(**base, QuantizeOptions{*target, false});
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto ours = GgufFile::Open(out);
    ASSERT_TRUE(ours.ok()) << ours.status();
    EXPECT_EQ(*(*ours)->GetInt("general.file_type"), t.file_type);
    for (const QuantizedTensor& q : *plan) {
      const GgufTensorInfo* got = (*ours)->FindTensor(q.name);
      ASSERT_NE(got, nullptr) << q.name;
      EXPECT_EQ(got->type, q.to) << q.name;
    }
    const std::vector<float> logits = PromptLogits(out);
    ASSERT_EQ(logits.size(), f32.size());
    rms[t.type] = RmsDiff(logits, f32);
    std::printf("%s: prompt RMS(logit - F32 logit) = %.4f (bound %.4f), max %.3g\n", t.type,
                rms[t.type], t.bound, MaxDiff(logits, f32));
    EXPECT_LE(rms[t.type], t.bound);
    r = RunCommand({Thermocline(), "info", out});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(absl::StrCat("uint32 ", t.file_type, " (", t.type, ")")),
              std::string::npos)
        << r.out;
    r = RunCommand({Thermocline(), "generate", "-m", out, "-p", "One day", "-n", "8", "-t", "0",
                    "--threads", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(r.out.size(), std::string("One day").size()) << r.out;
  }
  EXPECT_LT(rms["Q5_0"], rms["Q4_1"]);
  EXPECT_LT(rms["Q5_1"], rms["Q4_1"]);
}

TEST(QuantizeTest, RefusesWhatItCannotWrite) {
  const std::string in = ModelPath("quants/base-f32.gguf");
  const std::string out = testing::TempDir() + "/refused.gguf";
  auto r = RunCommand({Thermocline(), "quantize", in, out, "--type", "IQ3_XXS"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot write it yet"), std::string::npos) << r.err;
  r = RunCommand({Thermocline(), "quantize", in, out, "--type", "Q9_9"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is not a llama-quantize type"), std::string::npos) << r.err;
  // A quantized source is refused (requantizing rounds twice).
  r = RunCommand(
      {Thermocline(), "quantize", ModelPath("quants/Q8_0.gguf"), out, "--type", "Q4_0", "--pure"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("quantize from an f32, f16 or bf16 model"), std::string::npos) << r.err;
  r = RunCommand({Thermocline(), "quantize", in, "--type", "Q8_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("expected IN.gguf and OUT.gguf"), std::string::npos) << r.err;
  r = RunCommand({Thermocline(), "quantize", in, out, "--type", "Q8_0", "--threads", "-2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--threads must be 0 or more"), std::string::npos) << r.err;
}

// A tensor's rows are quantized on several threads: the file is the same byte for byte whatever
// their number (SameTensorBytesAsLlamaQuantize runs the default, every core), for a mix whose
// quantizers search each block's scales (the slow ones) and for the plain Q8_0.
TEST(QuantizeTest, TheBytesDoNotDependOnTheThreads) {
  for (const char* type : {"Q4_K_M", "IQ4_XS", "Q8_0"}) {
    SCOPED_TRACE(type);
    std::vector<std::string> files;
    for (const char* threads : {"1", "3"}) {
      files.push_back(testing::TempDir() + "/threads" + threads + "-" + type + ".gguf");
      auto r = RunCommand({Thermocline(), "quantize", ModelPath("quants/base-f32.gguf"),
                           files.back(), "--type", type, "--threads", threads});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    const std::string one = testing::ReadFileOrDie(files[0]);
    const std::string three = testing::ReadFileOrDie(files[1]);
    ASSERT_EQ(one.size(), three.size());
    const auto differ = std::mismatch(one.begin(), one.end(), three.begin());
    EXPECT_TRUE(differ.first == one.end())
        << "1 and 3 threads wrote different bytes from offset " << (differ.first - one.begin());
  }
}

}  // namespace
}  // namespace thermocline
