// llama.cpp's own tokenizer test vectors (../shared/tokenizers, README there): for every
// vocabulary, every case must encode to exactly llama.cpp's ids, raw (.out) and with
// add_special (.out-add-special), and decode back to the input.
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

std::string VocabPath(const std::string& name) {
  return testing::SharedDataDir() + "/tokenizers/ggml-vocab-" + name + ".gguf";
}

std::vector<std::string> ReadCases(const std::string& name) {
  const std::string inp = testing::ReadFileOrDie(VocabPath(name) + ".inp");
  constexpr std::string_view kSep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> cases;
  size_t start = 0;
  for (size_t pos; (pos = inp.find(kSep, start)) != std::string::npos; start = pos + kSep.size()) {
    cases.push_back(inp.substr(start, pos - start));
  }
  EXPECT_EQ(start, inp.size()) << "the .inp file must end with a separator";
  return cases;
}

std::vector<std::vector<int32_t>> ReadIds(const std::string& path) {
  const std::string text = testing::ReadFileOrDie(path);
  std::vector<std::vector<int32_t>> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<int32_t> ids;
    for (absl::string_view tok : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      int32_t id;
      EXPECT_TRUE(absl::SimpleAtoi(tok, &id)) << path << ": '" << tok << "'";
      ids.push_back(id);
    }
    lines.push_back(std::move(ids));
  }
  if (!lines.empty() && lines.back().empty() && !text.empty() && text.back() == '\n') {
    lines.pop_back();  // the newline that ends the last line
  }
  return lines;
}

const Tokenizer& LoadVocab(const std::string& name) {
  static auto* cache = new std::map<std::string, Tokenizer>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    absl::StatusOr<Tokenizer> t = Tokenizer::Load(VocabPath(name));
    EXPECT_TRUE(t.ok()) << t.status();
    it = cache->emplace(name, *std::move(t)).first;
  }
  return it->second;
}

class VocabTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabTest, EveryCaseMatchesLlamaCpp) {
  const std::string& name = GetParam();
  const Tokenizer& tok = LoadVocab(name);
  const std::vector<std::string> cases = ReadCases(name);
  const auto raw = ReadIds(VocabPath(name) + ".out");
  const auto special = ReadIds(VocabPath(name) + ".out-add-special");
  ASSERT_EQ(cases.size(), 46u);
  ASSERT_EQ(raw.size(), cases.size());
  ASSERT_EQ(special.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(tok.Encode(cases[i], EncodeOptions{}), raw[i]) << name << " case " << i << ": '"
                                                             << cases[i] << "'";
    EXPECT_EQ(tok.Encode(cases[i], EncodeOptions{.add_special = true}), special[i])
        << name << " case " << i << " (add_special)";
  }
}

// How many cases llama.cpp's detokenize gives back exactly (README): its text is Decode's plus,
// where the vocabulary says so, the clean_up_tokenization_spaces pass (which drops the space of
// " ?"); WordPiece also lower-cases and drops spacing.
int LlamaCppRoundTrips(const std::string& name) {
  if (name == "bert-bge") return 4;
  if (name == "gpt-2" || name == "falcon" || name == "starcoder") return 44;
  return 46;
}

TEST_P(VocabTest, DecodeGivesTheCasesBackLikeLlamaCpp) {
  const std::string& name = GetParam();
  const Tokenizer& tok = LoadVocab(name);
  const std::vector<std::string> cases = ReadCases(name);
  const auto raw = ReadIds(VocabPath(name) + ".out");
  ASSERT_EQ(raw.size(), cases.size());
  int llama_cpp_like = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<int32_t> ids = raw[i];
    // SentencePiece's dummy-prefix space is dropped after BOS (tokenizer.h).
    if (tok.kind() == TokenizerKind::kSentencePiece) ids.insert(ids.begin(), tok.bos());
    const std::string text = tok.Decode(ids);
    // Without the lossy clean-up, SentencePiece and BPE give every case back.
    if (tok.kind() != TokenizerKind::kWordPiece) {
      EXPECT_EQ(text, cases[i]) << name << " " << i;
    }
    const std::string like = tok.clean_spaces() ? CleanUpTokenizationSpaces(text) : text;
    llama_cpp_like += like == cases[i] ? 1 : 0;
  }
  EXPECT_EQ(llama_cpp_like, LlamaCppRoundTrips(name)) << name;
}

TEST(VocabTest, CleanUpTokenizationSpaces) {
  EXPECT_EQ(CleanUpTokenizationSpaces(" Hello , world ! ok ?"), " Hello, world! ok?");
  EXPECT_EQ(CleanUpTokenizationSpaces("a ' b"), "a'b");
  EXPECT_EQ(CleanUpTokenizationSpaces("it 's I 'm we 're you 've don 't I 'd we 'll"),
            "it's I'm we're you've don 't I 'd we 'll");
  EXPECT_EQ(CleanUpTokenizationSpaces(" !"), "!");
  EXPECT_EQ(CleanUpTokenizationSpaces(""), "");
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, VocabTest,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "falcon",
                                           "deepseek-llm", "starcoder", "bert-bge"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

// The two vocabularies upstream has no cases for: they load, and the cases of the others
// round-trip through them.
TEST(VocabTest, CaseLessVocabulariesLoadAndRoundTrip) {
  const std::vector<std::string> cases = ReadCases("gpt-2");
  for (const std::string name : {"gpt-neox", "baichuan"}) {
    const Tokenizer& tok = LoadVocab(name);
    for (size_t i = 0; i < cases.size(); ++i) {
      std::vector<int32_t> ids = tok.Encode(cases[i], EncodeOptions{});
      if (tok.kind() == TokenizerKind::kSentencePiece) ids.insert(ids.begin(), tok.bos());
      EXPECT_EQ(tok.Decode(ids), cases[i]) << name << " case " << i;
    }
  }
  EXPECT_EQ(LoadVocab("gpt-neox").pre(), "default");
  EXPECT_EQ(LoadVocab("gpt-neox").kind(), TokenizerKind::kBpe);
  EXPECT_EQ(LoadVocab("baichuan").kind(), TokenizerKind::kSentencePiece);
}

}  // namespace
}  // namespace thermocline
