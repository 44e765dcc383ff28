// shared/tokenizer/chat_prompt.h on llama.cpp's vocabularies (../shared/tokenizers): the chat
// template and BOS/EOS texts read from a GGUF, and the tokenization of rendered prompts: special
// tokens parsed, the vocabulary's BOS added exactly once whether or not the template wrote it,
// and none added where the vocabulary adds none.
#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/tokenizer/chat_prompt.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using ::testing::StartsWith;

std::string VocabPath(const std::string& name) {
  return testing::SharedDataDir() + "/tokenizers/ggml-vocab-" + name + ".gguf";
}

TEST(ChatPromptTest, ReadsTheTemplateAndTheBosEosTexts) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  auto phi3 = GgufFile::OpenHeader(VocabPath("phi-3"));
  ASSERT_TRUE(phi3.ok()) << phi3.status();
  const ModelChatTemplate t = ReadModelChatTemplate(**phi3);
  ASSERT_TRUE(t.source.has_value());
  EXPECT_THAT(*t.source, StartsWith("{{ bos_token }}"));
  EXPECT_EQ(t.bos_token, "<s>");
  EXPECT_EQ(t.eos_token, "<|endoftext|>");

  auto gpt2 = GgufFile::OpenHeader(VocabPath("gpt-2"));
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  const ModelChatTemplate none = ReadModelChatTemplate(**gpt2);
  EXPECT_FALSE(none.source.has_value());
  EXPECT_EQ(none.bos_token, "<|endoftext|>");
}

TEST(ChatPromptTest, BosIsAddedOnceAndSpecialTokensAreParsed) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  auto tok = Tokenizer::Load(VocabPath("phi-3"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_TRUE(tok->add_bos_token());
  const std::string turn = "<|user|>\nHello<|end|>\n<|assistant|>\n";
  const std::vector<int32_t> with_bos = EncodeChatPrompt(*tok, "<s>" + turn);
  const std::vector<int32_t> without = EncodeChatPrompt(*tok, turn);
  // The template's <s> is the vocabulary's BOS, not a second one; without it, BOS is added.
  EXPECT_EQ(with_bos, without);
  ASSERT_GT(with_bos.size(), 3u);
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(with_bos[1], 32010);  // <|user|>
  EXPECT_EQ(std::count(with_bos.begin(), with_bos.end(), 1), 1);
  EXPECT_EQ(with_bos, tok->Encode("<s>" + turn, EncodeOptions{.parse_special = true}));
  // A BOS text anywhere but at the start is the template's business: it stays a token.
  const std::vector<int32_t> inner = EncodeChatPrompt(*tok, turn + "<s>");
  EXPECT_EQ(std::count(inner.begin(), inner.end(), 1), 2);
}

TEST(ChatPromptTest, VocabulariesThatAddNoBosGetNone) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  auto tok = Tokenizer::Load(VocabPath("gpt-2"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_FALSE(tok->add_bos_token());
  EXPECT_EQ(EncodeChatPrompt(*tok, "Hi"), tok->Encode("Hi", EncodeOptions{}));
  const std::vector<int32_t> ids = EncodeChatPrompt(*tok, "<|endoftext|>Hi<|endoftext|>");
  EXPECT_EQ(ids.front(), 50256);
  EXPECT_EQ(ids.back(), 50256);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50256), 2);
}

}  // namespace
}  // namespace thermocline
