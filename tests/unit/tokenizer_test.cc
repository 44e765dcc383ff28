#include "shared/tokenizer/tokenizer.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/model/llama2c.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Tokenizer LoadLlama2c(const std::string& rel) {
  absl::StatusOr<Llama2cVocab> vocab = ReadLlama2cTokenizer(testing::ModelPath(rel), 512);
  EXPECT_TRUE(vocab.ok()) << vocab.status();
  absl::StatusOr<Tokenizer> tok = TokenizerFromLlama2c(*vocab);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

const Tokenizer& Stories() {
  static const Tokenizer* tok = new Tokenizer(LoadLlama2c("stories260K/tok512.bin"));
  return *tok;
}

const Tokenizer& Aidreams() {
  static const Tokenizer* tok = new Tokenizer(LoadLlama2c("aidreams260K/tok512.bin"));
  return *tok;
}

bool IsValidUtf8(const std::string& s) {
  // Decoding a string of plain byte tokens sanitizes it; valid input comes back unchanged.
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

TEST(TokenizerTest, Stories260KReferencePrompt) {
  EXPECT_THAT(Stories().Encode("Once upon a time", true), ElementsAre(1, 403, 407, 261, 378));
  EXPECT_THAT(Stories().Encode("Once upon a time", false), ElementsAre(403, 407, 261, 378));
}

TEST(TokenizerTest, Aidreams260KReferencePrompt) {
  EXPECT_THAT(Aidreams().Encode("I dreamed", true), ElementsAre(1, 303, 281, 269, 435, 447, 328));
}

TEST(TokenizerTest, FromShippedGgufMatchesLlama2cVocabulary) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file =
      GgufFile::Open(testing::ModelPath("stories260K/stories260K.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<Tokenizer> tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(tok->Encode("Once upon a time", true), ElementsAre(1, 403, 407, 261, 378));
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_EQ(tok->unk(), 0);
  ASSERT_EQ(tok->vocab_size(), Stories().vocab_size());
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    EXPECT_EQ(tok->piece(id), Stories().piece(id)) << id;
    EXPECT_EQ(tok->type(id), Stories().type(id)) << id;
    EXPECT_EQ(tok->score(id), Stories().score(id)) << id;
  }
  EXPECT_EQ(tok->piece(403), "\xE2\x96\x81Once");
}

TEST(TokenizerTest, EmptyText) {
  EXPECT_THAT(Stories().Encode("", true), ElementsAre(1));
  EXPECT_TRUE(Stories().Encode("", false).empty());
  EXPECT_EQ(Stories().Decode(std::vector<int32_t>{1}), "");
}

TEST(TokenizerTest, TokenBytes) {
  const Tokenizer& t = Stories();
  EXPECT_EQ(t.TokenBytes(-1, 403), " Once");
  EXPECT_EQ(t.TokenBytes(1, 403), "Once");  // leading space dropped after BOS
  EXPECT_EQ(t.TokenBytes(403, 407), " upon");
  EXPECT_EQ(t.TokenBytes(-1, 1), "");  // control
  EXPECT_EQ(t.TokenBytes(-1, 2), "");
  EXPECT_EQ(t.TokenBytes(-1, 3 + 0x41), "A");  // <0x41>
  EXPECT_EQ(t.TokenBytes(1, 3 + 0x20), " ");   // a byte token keeps its space after BOS
  EXPECT_EQ(t.TokenBytes(-1, 3 + 0xE6), "\xE6");
  EXPECT_EQ(t.TokenBytes(-1, -5), "");
  EXPECT_EQ(t.TokenBytes(-1, 512), "");
}

class RoundTripTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RoundTripTest, DecodeOfEncodeIsIdentity) {
  const std::string& s = GetParam();
  for (const Tokenizer* t : {&Stories(), &Aidreams()}) {
    const std::vector<int32_t> ids = t->Encode(s, /*add_bos=*/true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], t->bos());
    EXPECT_EQ(t->Decode(ids), s);

    // Streaming gives the same text, and every chunk is valid UTF-8 on its own.
    StreamingDetokenizer detok(*t);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string chunk = detok.Push(id);
      EXPECT_TRUE(IsValidUtf8(chunk));
      streamed += chunk;
      EXPECT_EQ(s.substr(0, streamed.size()), streamed);
    }
    streamed += detok.Flush();
    EXPECT_EQ(streamed, s);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Texts, RoundTripTest,
    ::testing::Values("Once upon a time", "Hello, World! 123", "caf\xC3\xA9 na\xC3\xAFve",
                      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",        // 日本語
                      "I feel \xF0\x9F\x99\x82 today \xF0\x9F\x99\x82",  // 🙂
                      "line one\nline two\n\n", "\n", " leading space", "   three leading",
                      "trailing space ", "trailing three   ", "many    inner   spaces", " ",
                      "   ", "tab\there", "<s> and </s> and <0x41> are just text"));

TEST(TokenizerTest, MultiByteFallsBackToByteTokens) {
  // 日 is not in the 512-token vocabulary: its three bytes become <0xE6> <0x97> <0xA5>.
  const std::vector<int32_t> ids = Stories().Encode("\xE6\x97\xA5", false);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_THAT(std::vector<int32_t>(ids.end() - 3, ids.end()),
              ElementsAre(3 + 0xE6, 3 + 0x97, 3 + 0xA5));
  // é is a piece of its own in stories260K's vocabulary (id 485).
  EXPECT_EQ(Stories().Encode("\xC3\xA9", false).back(), 485);
}

TEST(TokenizerTest, StreamingHoldsBackIncompleteUtf8) {
  const Tokenizer& t = Stories();
  StreamingDetokenizer d(t);
  // 🙂 = F0 9F 99 82 as four byte tokens.
  EXPECT_EQ(d.Push(3 + 0xF0), "");
  EXPECT_EQ(d.Push(3 + 0x9F), "");
  EXPECT_EQ(d.Push(3 + 0x99), "");
  EXPECT_EQ(d.Push(3 + 0x82), "\xF0\x9F\x99\x82");
  EXPECT_EQ(d.Push(3 + 'x'), "x");
  EXPECT_EQ(d.Flush(), "");
}

TEST(TokenizerTest, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer& t = Stories();
  const std::string kFffd = "\xEF\xBF\xBD";
  auto decode_bytes = [&](const std::string& bytes) {
    std::vector<int32_t> ids;
    for (char c : bytes) ids.push_back(3 + static_cast<uint8_t>(c));
    return t.Decode(ids);
  };
  EXPECT_EQ(decode_bytes("\xFF" "a"), kFffd + "a");
  EXPECT_EQ(decode_bytes("a\x80"), "a" + kFffd);
  EXPECT_EQ(decode_bytes("\xE6\x97" "A"), kFffd + "A");  // truncated sequence: one U+FFFD
  EXPECT_EQ(decode_bytes("\xE6\x97"), kFffd);              // cut off at the end
  EXPECT_EQ(decode_bytes("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(decode_bytes("\xC0\xAF"), kFffd + kFffd);              // overlong
  EXPECT_EQ(decode_bytes("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF

  // Text with invalid UTF-8 encodes (invalid bytes are symbols of their own) and decodes to
  // the sanitized text; streaming agrees whatever the chunking.
  const std::string bad = "ok \xFF\xE6\x97 \xE6\x97\xA5 \xC3";
  const std::vector<int32_t> ids = t.Encode(bad, true);
  const std::string expected = "ok " + kFffd + kFffd + " \xE6\x97\xA5 " + kFffd;
  EXPECT_EQ(t.Decode(ids), expected);
  StreamingDetokenizer d(t);
  std::string streamed;
  for (int32_t id : ids) streamed += d.Push(id);
  streamed += d.Flush();
  EXPECT_EQ(streamed, expected);
}

TEST(TokenizerTest, FlushResetsState) {
  const Tokenizer& t = Stories();
  StreamingDetokenizer d(t);
  EXPECT_EQ(d.Push(1), "");
  EXPECT_EQ(d.Push(403), "Once");
  EXPECT_EQ(d.Push(3 + 0xE6), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.Push(403), " Once");  // no BOS before it any more
}

// A tiny vocabulary whose merges are easy to reason about.
Tokenizer Synthetic(bool with_bytes) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<TokenType> types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  auto add = [&](std::string p, float s, TokenType ty) {
    pieces.push_back(std::move(p));
    scores.push_back(s);
    types.push_back(ty);
  };
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      add(buf, 0, TokenType::kByte);
    }
  }
  add("\xE2\x96\x81", -1, TokenType::kNormal);  // base + 0
  add("a", -1, TokenType::kNormal);             // base + 1
  add("b", -1, TokenType::kNormal);             // base + 2
  add("ab", -5, TokenType::kNormal);            // base + 3
  add("ba", -5, TokenType::kNormal);            // base + 4: ties with "ab"
  add("aa", -2, TokenType::kNormal);            // base + 5: preferred over ab/ba
  add("c", -1, TokenType::kNormal);             // base + 6
  add("cc", 10, TokenType::kControl);           // base + 7: never merged
  add("d", -1, TokenType::kNormal);             // base + 8
  add("dd", 3, TokenType::kUserDefined);        // base + 9: merged
  absl::StatusOr<Tokenizer> t =
      Tokenizer::FromVocab(pieces, scores, types, /*bos=*/1, /*eos=*/2, /*unk=*/0);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

TEST(TokenizerTest, MergeOrder) {
  const Tokenizer t = Synthetic(true);
  const int base = 3 + 256;
  // "▁aba": ab and ba tie; the leftmost pair (ab) merges first.
  EXPECT_THAT(t.Encode("aba", false), ElementsAre(base + 0, base + 3, base + 1));
  // "▁baa": aa has the best score even though ba is further left.
  EXPECT_THAT(t.Encode("baa", false), ElementsAre(base + 0, base + 2, base + 5));
  // Control pieces are not merge targets; user-defined pieces are.
  EXPECT_THAT(t.Encode("cc", false), ElementsAre(base + 0, base + 6, base + 6));
  EXPECT_THAT(t.Encode("dd", false), ElementsAre(base + 0, base + 9));
  // Not in the vocabulary: byte fallback.
  EXPECT_THAT(t.Encode("z", false), ElementsAre(base + 0, 3 + 'z'));
}

TEST(TokenizerTest, UnknownWithoutByteTokens) {
  const Tokenizer t = Synthetic(false);
  EXPECT_THAT(t.Encode("az", true), ElementsAre(1, 3, 4, 0));
}

TEST(TokenizerTest, FromVocabValidates) {
  auto make = [](std::vector<std::string> p, std::vector<float> s, std::vector<TokenType> ty,
                 int32_t bos) { return Tokenizer::FromVocab(p, s, ty, bos, 2, 0); };
  const std::vector<TokenType> ok_types = {TokenType::kUnknown, TokenType::kControl,
                                           TokenType::kControl};
  EXPECT_TRUE(make({"<unk>", "<s>", "</s>"}, {0, 0, 0}, ok_types, 1).ok());
  EXPECT_THAT(make({"<unk>", "<s>"}, {0, 0, 0}, ok_types, 1).status().message(),
              HasSubstr("must agree"));
  EXPECT_THAT(make({"<unk>", "<s>", "</s>"}, {0, 0, 0}, ok_types, 7).status().message(),
              HasSubstr("bos token id 7"));
  EXPECT_THAT(make({}, {}, {}, 1).status().message(), HasSubstr("empty"));
  EXPECT_THAT(make({"<unk>", "<s>", "x"}, {0, 0, 0},
                   {TokenType::kUnknown, TokenType::kControl, TokenType::kByte}, 1)
                  .status()
                  .message(),
              HasSubstr("<0xNN>"));
  EXPECT_THAT(make({"<unk>", "<s>", "</s>"}, {0, NAN, 0}, ok_types, 1).status().message(),
              HasSubstr("NaN"));
  EXPECT_THAT(make({"<unk>", "<s>", "</s>"}, {0, 0, 0},
                   {TokenType::kUnknown, TokenType::kControl, static_cast<TokenType>(9)}, 1)
                  .status()
                  .message(),
              HasSubstr("token type"));
}

// Writes a GGUF with the given tokenizer keys and loads a Tokenizer from it.
absl::StatusOr<Tokenizer> FromGgufWith(const std::function<void(GgufWriter&)>& edit) {
  GgufWriter w;
  w.SetValue("general.architecture", GgufString("llama"));
  w.SetValue("tokenizer.ggml.model", GgufString("llama"));
  w.SetValue("tokenizer.ggml.tokens", GgufStringArray({"<unk>", "<s>", "</s>", "\xE2\x96\x81x"}));
  w.SetValue("tokenizer.ggml.scores", GgufF32Array({0, 0, 0, -1}));
  w.SetValue("tokenizer.ggml.token_type", GgufI32Array({2, 3, 3, 1}));
  w.SetValue("tokenizer.ggml.bos_token_id", GgufU32(1));
  w.SetValue("tokenizer.ggml.eos_token_id", GgufU32(2));
  w.SetValue("tokenizer.ggml.unknown_token_id", GgufU32(0));
  edit(w);
  const std::string path = testing::TempDir() + "/tok.gguf";
  absl::Status st = w.WriteFile(path);
  if (!st.ok()) return st;
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  return Tokenizer::FromGguf(**f);
}

TEST(TokenizerTest, FromGgufValidates) {
  absl::StatusOr<Tokenizer> ok = FromGgufWith([](GgufWriter&) {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_THAT(ok->Encode("x", true), ElementsAre(1, 3));

  auto error = [](const std::function<void(GgufWriter&)>& edit) {
    absl::StatusOr<Tokenizer> t = FromGgufWith(edit);
    EXPECT_FALSE(t.ok());
    return std::string(t.status().message());
  };
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.model", GgufString("gpt2"));
              }),
              HasSubstr("'gpt2'"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.scores", GgufF32Array({0, 0}));
              }),
              HasSubstr("tokenizer.ggml.scores has 2 entries"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.token_type", GgufI32Array({2, 3, 3, 1, 1}));
              }),
              HasSubstr("tokenizer.ggml.token_type has 5 entries"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.token_type", GgufI32Array({2, 3, 3, 42}));
              }),
              HasSubstr("token_type[3]"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.bos_token_id", GgufU32(4));
              }),
              HasSubstr("tokenizer.ggml.bos_token_id = 4"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.eos_token_id", GgufString("two"));
              }),
              HasSubstr("tokenizer.ggml.eos_token_id"));
  EXPECT_THAT(error([](GgufWriter& w) {
                w.SetValue("tokenizer.ggml.tokens", GgufF32Array({0, 0, 0, 0}));
              }),
              HasSubstr("tokenizer.ggml.tokens[0] is not a string"));
}

TEST(TokenizerTest, FromGgufNeedsTokenizerKeys) {
  GgufWriter w;
  w.SetValue("general.architecture", GgufString("llama"));
  const std::string path = testing::TempDir() + "/notok.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<Tokenizer> t = Tokenizer::FromGguf(**f);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("tokenizer.ggml.model"));
}

TEST(TokenizerTest, RandomTextRoundTrips) {
  // Random mixes of ASCII, spaces, newlines and 2/3/4-byte characters come back exactly; random
  // bytes come back as their sanitized form, the same streamed or not.
  std::mt19937 rng(12345);
  const std::vector<std::string> atoms = {"a", "e", "the", " ", "  ", "\n", "Lily", ".", "\xC3\xA9",
                                          "\xCE\xBB", "\xE6\x97\xA5", "\xE2\x80\x9C",
                                          "\xF0\x9F\x99\x82", "~", "\t", "0"};
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    for (const Tokenizer* t : {&Stories(), &Aidreams()}) {
      ASSERT_EQ(t->Decode(t->Encode(text, true)), text);
    }
    std::string bytes;
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>(rng() % 256));
    std::vector<int32_t> byte_ids = {1};
    for (char c : bytes) byte_ids.push_back(3 + static_cast<uint8_t>(c));
    const std::string sanitized = Stories().Decode(byte_ids);
    EXPECT_TRUE(IsValidUtf8(sanitized));
    const std::vector<int32_t> ids = Stories().Encode(bytes, true);
    EXPECT_EQ(Stories().Decode(ids), sanitized);
    StreamingDetokenizer d(Stories());
    std::string streamed;
    for (int32_t id : ids) streamed += d.Push(id);
    EXPECT_EQ(streamed + d.Flush(), sanitized);
  }
}

TEST(TokenizerTest, LongInputIsFast) {
  // O(n log n): a long text of repeated words must not take quadratic time. 200 KB of input
  // would take minutes with a quadratic merge loop.
  std::string text;
  while (text.size() < 200000) text += "Once upon a time there was a little girl named Lily. ";
  const std::vector<int32_t> ids = Stories().Encode(text, true);
  EXPECT_EQ(Stories().Decode(ids), text);
}

}  // namespace
}  // namespace thermocline
