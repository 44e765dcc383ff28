// `thermocline quantize` on the shared F32 source (../shared/models/quants/base-f32.gguf)
// against the files llama.cpp's llama-quantize wrote from it: every tensor's type, shape and
// bytes, compared one by one, and the file type recorded.
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
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
}

}  // namespace
}  // namespace thermocline
