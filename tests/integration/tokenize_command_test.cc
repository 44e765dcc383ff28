// `thermocline tokenize` as a real process on llama.cpp's vocabulary-only GGUFs: its ids equal
// llama.cpp's (../shared/tokenizers/*.out), and the errors a user sees.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::RunCommand;

std::string VocabPath(const std::string& name) {
  return testing::SharedDataDir() + "/tokenizers/ggml-vocab-" + name + ".gguf";
}

// Runs `thermocline tokenize ARGS...` with `input` as standard input.
testing::CommandResult Tokenize(const std::string& input, std::vector<std::string> args) {
  const std::string in = testing::TempDir() + "/stdin.txt";
  FILE* f = std::fopen(in.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  std::fwrite(input.data(), 1, input.size(), f);
  std::fclose(f);
  std::vector<std::string> argv = {"/bin/sh", "-c", "in=\"$1\"; shift; exec \"$@\" < \"$in\"",
                                   "sh", in, testing::BinDir() + "/thermocline", "tokenize"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

// llama.cpp's expected ids of case `index` as one space-separated line.
std::string ExpectedLine(const std::string& name, size_t index) {
  const std::string out = testing::ReadFileOrDie(VocabPath(name) + ".out");
  std::vector<std::string> lines = absl::StrSplit(out, '\n');
  EXPECT_LT(index, lines.size());
  std::vector<std::string> ids = absl::StrSplit(lines[index], ' ', absl::SkipEmpty());
  return absl::StrJoin(ids, " ") + "\n";
}

std::string Case(const std::string& name, size_t index) {
  const std::string inp = testing::ReadFileOrDie(VocabPath(name) + ".inp");
  std::vector<std::string> cases = absl::StrSplit(inp, "\n__ggml_vocab_test__\n");
  EXPECT_LT(index, cases.size());
  return cases[index];
}

TEST(TokenizeCommandTest, IdsEqualLlamaCpp) {
  // Case 28 is "    Hello\n    Hello"; 45 is the long mixed one (emoji, CJK, digits, quotes).
  ASSERT_EQ(Case("gpt-2", 28), "    Hello\n    Hello");
  for (size_t index : {size_t{1}, size_t{28}, size_t{45}}) {
    for (const std::string name : {"gpt-2", "deepseek-llm", "llama-spm", "bert-bge"}) {
      auto r = Tokenize(Case(name, index), {"--model", VocabPath(name)});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, ExpectedLine(name, index)) << name << " case " << index;
    }
  }
}

TEST(TokenizeCommandTest, AddBosAndParseSpecial) {
  auto plain = Tokenize("<|endoftext|>", {"--model", VocabPath("gpt-2")});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out, "50256\n");
  auto parsed = Tokenize("<|endoftext|>", {"--model", VocabPath("gpt-2"), "--parse-special"});
  ASSERT_EQ(parsed.exit_code, 0) << parsed.err;
  EXPECT_EQ(parsed.out, "50256\n");
  ASSERT_EQ(Case("llama-spm", 23), "Hello");
  auto bos = Tokenize("Hello", {"--model", VocabPath("llama-spm"), "--add-bos"});
  ASSERT_EQ(bos.exit_code, 0) << bos.err;
  EXPECT_EQ(bos.out, "1 " + ExpectedLine("llama-spm", 23));
  auto empty = Tokenize("", {"--model", VocabPath("gpt-2")});
  ASSERT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_EQ(empty.out, "\n");
}

TEST(TokenizeCommandTest, Errors) {
  // Not a tokenizer: the error names the file and the key.
  const std::string stories = testing::ModelPath("stories260K/stories260K.gguf");
  auto ok = Tokenize("x", {"--model", stories});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  const std::string plan = testing::TempDir() + "/no-vocab.gguf";
  {
    FILE* f = std::fopen(plan.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    // A GGUF v3 header with no tensors and no metadata.
    const unsigned char header[] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                    0, 0, 0, 0, 0, 0, 0, 0};
    std::fwrite(header, 1, sizeof header, f);
    std::fclose(f);
  }
  auto novocab = Tokenize("x", {"--model", plan});
  EXPECT_EQ(novocab.exit_code, 1);
  EXPECT_NE(novocab.err.find("tokenizer.ggml.model"), std::string::npos) << novocab.err;
  EXPECT_NE(novocab.err.find("no-vocab.gguf"), std::string::npos) << novocab.err;
  auto missing = Tokenize("x", {"--model", testing::TempDir() + "/none.gguf"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("none.gguf"), std::string::npos) << missing.err;
  auto usage = Tokenize("x", {});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_NE(usage.err.find("--model"), std::string::npos) << usage.err;
}

}  // namespace
}  // namespace thermocline
