// Special tokens, flags and validation of the GGUF tokenizers, on llama.cpp's vocabularies
// (../shared/tokenizers) and on small files written here.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/tokenizer/pretokenizer.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const Tokenizer& Vocab(const std::string& name) {
  static auto* cache = new std::map<std::string, Tokenizer>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    absl::StatusOr<Tokenizer> t = Tokenizer::Load(testing::SharedDataDir() +
                                                  "/tokenizers/ggml-vocab-" + name + ".gguf");
    EXPECT_TRUE(t.ok()) << t.status();
    it = cache->emplace(name, *std::move(t)).first;
  }
  return it->second;
}

std::vector<int32_t> Concat(std::vector<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

constexpr EncodeOptions kParse{.parse_special = true};

TEST(TokenizerSpecialTest, Gpt2EndOfTextIsParsedOnlyWhenAsked) {
  const Tokenizer& t = Vocab("gpt-2");
  EXPECT_EQ(t.kind(), TokenizerKind::kBpe);
  EXPECT_EQ(t.pre(), "gpt-2");
  EXPECT_THAT(t.Encode("<|endoftext|>", kParse), ElementsAre(50256));
  EXPECT_THAT(t.Encode("<|endoftext|>", EncodeOptions{}), Not(Contains(50256)));
  EXPECT_EQ(t.Encode("Hello<|endoftext|> world", kParse),
            Concat({t.Encode("Hello", EncodeOptions{}), {50256},
                    t.Encode(" world", EncodeOptions{})}));
  // Control tokens are printed only when asked.
  EXPECT_EQ(t.Decode(std::vector<int32_t>{50256}), "");
  EXPECT_EQ(t.Decode(std::vector<int32_t>{50256}, /*render_special=*/true), "<|endoftext|>");
  EXPECT_EQ(t.bos(), 50256);
  EXPECT_EQ(t.eos(), 50256);
  EXPECT_EQ(t.eot(), 50256);
  EXPECT_THAT(t.eog_ids(), ElementsAre(50256));
  EXPECT_FALSE(t.add_bos_token());
  EXPECT_TRUE(t.Encode("", EncodeOptions{.add_special = true}).empty());
}

TEST(TokenizerSpecialTest, DeepseekUserDefinedTokensAreCutOutOfRawText) {
  const Tokenizer& t = Vocab("deepseek-llm");
  EXPECT_EQ(t.type(100014), TokenType::kUserDefined);
  EXPECT_EQ(t.piece(100014), "\xC3\xBC");  // ü
  EXPECT_THAT(t.Encode("\xC3\xBC", EncodeOptions{}), ElementsAre(100014));
  EXPECT_EQ(t.Decode(std::vector<int32_t>{100014}), "\xC3\xBC");
  EXPECT_TRUE(t.add_bos_token());
  EXPECT_THAT(t.Encode("", EncodeOptions{.add_special = true}), ElementsAre(100000));
  EXPECT_EQ(t.eos(), 100001);
  EXPECT_EQ(t.eot(), 100001);  // <｜end▁of▁sentence｜>, found by its text
  EXPECT_TRUE(t.IsEog(100001));
  EXPECT_FALSE(t.IsEog(100000));
  // BOS is control: parsed when asked, printed when asked.
  const std::string bos_text = t.piece(100000);
  EXPECT_THAT(t.Encode(bos_text + "Hi", kParse),
              ElementsAre(100000, t.Encode("Hi", EncodeOptions{})[0]));
  EXPECT_EQ(t.Decode(std::vector<int32_t>{100000}), "");
  EXPECT_EQ(t.Decode(std::vector<int32_t>{100000}, true), bos_text);
}

TEST(TokenizerSpecialTest, Phi3ChatTokensStripTheWhitespaceAfterThem) {
  const Tokenizer& t = Vocab("phi-3");
  EXPECT_EQ(t.kind(), TokenizerKind::kSentencePiece);
  // llama.cpp gives Phi-3's special tokens RSTRIP: the newline after <|user|> goes.
  EXPECT_EQ(t.Encode("<|user|>\nHi<|end|>\n<|assistant|>", kParse),
            Concat({{32010}, t.Encode("Hi", EncodeOptions{}), {32007, 32001}}));
  EXPECT_THAT(t.Encode("<|user|>", EncodeOptions{}), Not(Contains(32010)));
  EXPECT_EQ(t.eot(), 32007);
  EXPECT_TRUE(t.IsEog(32000));  // <|endoftext|> = EOS
  EXPECT_TRUE(t.IsEog(32007));  // <|end|>
  EXPECT_FALSE(t.IsEog(32001));
  EXPECT_THAT(t.Encode("Hi", EncodeOptions{.add_special = true}),
              ElementsAre(1, t.Encode("Hi", EncodeOptions{})[0]));
}

TEST(TokenizerSpecialTest, SentencePieceParsesBosAndKeepsTheSpacePrefixRule) {
  const Tokenizer& t = Vocab("llama-spm");
  EXPECT_TRUE(t.add_space_prefix());
  // After a special token the next text gets the dummy prefix again (llama.cpp).
  EXPECT_EQ(t.Encode("<s>Hello", kParse), Concat({{1}, t.Encode("Hello", EncodeOptions{})}));
  EXPECT_THAT(t.Encode("<s>", EncodeOptions{}), Not(Contains(1)));
  EXPECT_EQ(t.Encode("Hello", true), Concat({{1}, t.Encode("Hello", EncodeOptions{})}));
  EXPECT_THAT(t.eog_ids(), ElementsAre(2));
  EXPECT_EQ(t.eot(), -1);
}

TEST(PretokenizerTest, EveryKnownNameCompilesAndCoversItsInput) {
  const std::string text =
      "Hello, y'all! How are you \xF0\x9F\x98\x81 ?\xE6\x88\x91\xE6\x83\xB3 apple 1314151 "
      "I'VE  \t\n\n \xD0\xBD\xD0\xB5\xD1\x89\xD0\xBE 3.14 \xE2\x80\x9C" "quoted\xE2\x80\x9D  ";
  ASSERT_GE(Pretokenizer::KnownNames().size(), 30u);
  for (std::string_view name : Pretokenizer::KnownNames()) {
    absl::StatusOr<std::shared_ptr<const Pretokenizer>> p = Pretokenizer::ForName(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    std::string joined;
    for (std::string_view w : (*p)->Split(text)) {
      EXPECT_FALSE(w.empty()) << name;
      joined += w;
    }
    EXPECT_EQ(joined, text) << name;
  }
}

std::vector<std::string> Words(std::string_view pre, std::string_view text) {
  absl::StatusOr<std::shared_ptr<const Pretokenizer>> p = Pretokenizer::ForName(pre);
  EXPECT_TRUE(p.ok()) << p.status();
  std::vector<std::string> out;
  for (std::string_view w : (*p)->Split(text)) out.emplace_back(w);
  return out;
}

// What the Hugging Face pre-tokenizers of these models (tiktoken-style regexes) split into.
TEST(PretokenizerTest, SplitsLikeTheModelsOwnRegexes) {
  EXPECT_THAT(Words("llama-bpe", "Hello world 12345 I'M"),
              ElementsAre("Hello", " world", " ", "123", "45", " I", "'M"));
  EXPECT_THAT(Words("qwen2", "x 12345"), ElementsAre("x", " ", "1", "2", "3", "4", "5"));
  EXPECT_THAT(Words("gpt-2", "Hello   world"), ElementsAre("Hello", "  ", " world"));
  EXPECT_THAT(Words("tekken", "HelloWorld ABCdef"),
              ElementsAre("Hello", "World", " ABCdef"));
  EXPECT_THAT(Words("starcoder", "x=123"), ElementsAre("x", "=", "1", "2", "3"));
}

// Writes a GGUF with a small byte-level BPE vocabulary and the given edits, and loads it.
absl::StatusOr<Tokenizer> BpeWith(const std::function<void(GgufWriter&)>& edit,
                                  bool with_pre = true) {
  GgufWriter w;
  w.SetValue("general.architecture", GgufString("gpt2"));
  w.SetValue("tokenizer.ggml.model", GgufString("gpt2"));
  if (with_pre) w.SetValue("tokenizer.ggml.pre", GgufString("gpt-2"));
  w.SetValue("tokenizer.ggml.tokens", GgufStringArray({"a", "b", "ab", "\xC4\xA0", "<|eot|>"}));
  w.SetValue("tokenizer.ggml.token_type", GgufI32Array({1, 1, 1, 1, 3}));
  w.SetValue("tokenizer.ggml.merges", GgufStringArray({"a b"}));
  w.SetValue("tokenizer.ggml.eos_token_id", GgufU32(4));
  w.SetValue("tokenizer.ggml.bos_token_id", GgufU32(4));
  edit(w);
  const std::string path = testing::TempDir() + "/bpe.gguf";
  absl::Status st = w.WriteFile(path);
  if (!st.ok()) return st;
  return Tokenizer::Load(path);
}

TEST(TokenizerSpecialTest, SmallBpeVocabulary) {
  absl::StatusOr<Tokenizer> t = BpeWith([](GgufWriter&) {});
  ASSERT_TRUE(t.ok()) << t.status();
  // "ab a" -> words "ab", " a" -> "ab" merges; " a" is Ġ + a, which has no merge.
  EXPECT_THAT(t->Encode("ab a", EncodeOptions{}), ElementsAre(2, 3, 0));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{2, 3, 0}), "ab a");
  // A character with no token is dropped, as llama.cpp does.
  EXPECT_THAT(t->Encode("az", EncodeOptions{}), ElementsAre(0));
  EXPECT_THAT(t->Encode("<|eot|>", kParse), ElementsAre(4));
}

TEST(TokenizerSpecialTest, BpeFilesAreValidated) {
  auto error = [](const std::function<void(GgufWriter&)>& edit) {
    absl::StatusOr<Tokenizer> t = BpeWith(edit);
    EXPECT_FALSE(t.ok());
    return std::string(t.status().message());
  };
  const std::string unknown = error(
      [](GgufWriter& w) { w.SetValue("tokenizer.ggml.pre", GgufString("no-such-pre")); });
  EXPECT_THAT(unknown, HasSubstr("'no-such-pre'"));
  for (const char* known : {"default", "llama-bpe", "qwen2", "deepseek-coder", "mpt", "refact",
                            "smollm", "tekken", "command-r", "olmo", "stablelm2"}) {
    EXPECT_THAT(unknown, HasSubstr(known));
  }
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.merges", GgufStringArray({"a b", "ab"}));
              }),
              HasSubstr("tokenizer.ggml.merges[1]"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.merges", GgufStringArray({"a "}));
              }),
              HasSubstr("tokenizer.ggml.merges[0]"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.merges", GgufI32Array({1}));
              }),
              HasSubstr("tokenizer.ggml.merges"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.add_bos_token", GgufU32(1));
              }),
              HasSubstr("tokenizer.ggml.add_bos_token is not a bool"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.eot_token_id", GgufU32(99));
              }),
              HasSubstr("tokenizer.ggml.eot_token_id = 99"));
  EXPECT_THAT(error([](GgufWriter& w) { w.SetValue("tokenizer.ggml.model", GgufString("t5")); }),
              HasSubstr("tokenizer.ggml.model is 't5'"));
  // A WordPiece vocabulary must hold its [CLS] and [SEP] (ids 101 and 102 by default).
  EXPECT_THAT(error([](GgufWriter& w) { w.SetValue("tokenizer.ggml.model", GgufString("bert")); }),
              HasSubstr("[SEP]"));
  // The pre key may be missing (gpt-neox): llama.cpp's default pre-tokenizer.
  absl::StatusOr<Tokenizer> none = BpeWith([](GgufWriter&) {}, /*with_pre=*/false);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->pre(), "default");
}

TEST(TokenizerSpecialTest, LoadNamesTheFile) {
  absl::StatusOr<Tokenizer> t = Tokenizer::Load(testing::TempDir() + "/missing.gguf");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("missing.gguf"));
}

}  // namespace
}  // namespace thermocline
