// CopyTokenizerMetadata: a GGUF written with a vocabulary file's tokenizer keys tokenizes like
// that file.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/tokenizer/vocab_metadata.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using ::testing::HasSubstr;

std::string VocabPath(const std::string& name) {
  return testing::SharedDataDir() + "/tokenizers/ggml-vocab-" + name + ".gguf";
}

TEST(VocabMetadataTest, CopiedVocabularyTokenizesTheSame) {
  const std::string text = testing::ReadFileOrDie(VocabPath("deepseek-llm") + ".inp");
  for (const std::string name : {"deepseek-llm", "phi-3", "starcoder", "bert-bge"}) {
    absl::StatusOr<std::unique_ptr<GgufFile>> src = GgufFile::Open(VocabPath(name));
    ASSERT_TRUE(src.ok()) << src.status();
    GgufWriter w;
    w.SetValue("general.architecture", GgufString("llama"));
    w.SetValue("tokenizer.ggml.model", GgufString("replaced"));
    absl::StatusOr<int32_t> n = CopyTokenizerMetadata(**src, w);
    ASSERT_TRUE(n.ok()) << n.status();
    const std::string path = testing::TempDir() + "/copy-" + name + ".gguf";
    ASSERT_TRUE(w.WriteFile(path).ok());

    absl::StatusOr<Tokenizer> a = Tokenizer::Load(VocabPath(name));
    absl::StatusOr<Tokenizer> b = Tokenizer::Load(path);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*n, a->vocab_size());
    EXPECT_EQ(b->vocab_size(), a->vocab_size());
    for (bool parse : {false, true}) {
      const EncodeOptions o{.add_special = true, .parse_special = parse};
      EXPECT_EQ(b->Encode(text, o), a->Encode(text, o)) << name;
    }
    EXPECT_EQ(b->eog_ids(), a->eog_ids());
    absl::StatusOr<std::unique_ptr<GgufFile>> copy = GgufFile::Open(path);
    ASSERT_TRUE(copy.ok());
    int copied = 0;
    for (const auto& [key, value] : (*src)->metadata()) {
      if (key.rfind("tokenizer.", 0) == 0) {
        ++copied;
        EXPECT_NE((*copy)->FindValue(key), nullptr) << key;
      }
    }
    EXPECT_GE(copied, 5);
    EXPECT_EQ(*(*copy)->FindValue("general.architecture")->AsString(), "llama");
  }
}

TEST(VocabMetadataTest, BrokenVocabularyIsRefusedAndNothingCopied) {
  GgufWriter bad;
  bad.SetValue("general.architecture", GgufString("llama"));
  bad.SetValue("tokenizer.ggml.model", GgufString("gpt2"));
  bad.SetValue("tokenizer.ggml.tokens", GgufStringArray({"a"}));
  bad.SetValue("tokenizer.ggml.pre", GgufString("unheard-of"));
  bad.SetValue("tokenizer.ggml.merges", GgufStringArray({}));
  const std::string bad_path = testing::TempDir() + "/bad-vocab.gguf";
  ASSERT_TRUE(bad.WriteFile(bad_path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> src = GgufFile::Open(bad_path);
  ASSERT_TRUE(src.ok());
  GgufWriter w;
  w.SetValue("general.architecture", GgufString("llama"));
  absl::StatusOr<int32_t> n = CopyTokenizerMetadata(**src, w);
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), HasSubstr("'unheard-of'"));
  const std::string path = testing::TempDir() + "/nothing.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->FindValue("tokenizer.ggml.model"), nullptr);
}

}  // namespace
}  // namespace thermocline
