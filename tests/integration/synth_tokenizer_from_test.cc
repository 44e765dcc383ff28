// `synth --tokenizer-from VOCAB.gguf`: a synthetic model with another file's vocabulary, so every
// tokenizer kind can be served end to end. The model takes the vocabulary's size and every
// tokenizer.* key; `thermocline tokenize` on it gives llama.cpp's ids for the vocabulary's own test
// cases; the model runs; a broken vocabulary is refused naming the flag.
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::BinDir;
using testing::RunCommand;

std::string Vocab(const std::string& name) {
  return testing::SharedDataDir() + "/tokenizers/ggml-vocab-" + name + ".gguf";
}

// The first non-empty case of llama.cpp's test vectors and its expected ids.
std::pair<std::string, std::string> FirstCase(const std::string& name) {
  const std::string inp = testing::ReadFileOrDie(Vocab(name) + ".inp");
  const std::string out = testing::ReadFileOrDie(Vocab(name) + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::istringstream lines(out);
  size_t at = 0;
  std::string ids;
  while (true) {
    const size_t next = inp.find(sep, at);
    if (next == std::string::npos) return {"", ""};
    std::getline(lines, ids);
    const std::string text = inp.substr(at, next - at);
    at = next + sep.size();
    if (text.size() > 8) return {text, ids};
  }
}

TEST(SynthTokenizerFromTest, ModelCarriesTheVocabularyAndTokenizesLikeLlamaCpp) {
  for (const std::string name : {"gpt-2", "llama-spm", "falcon"}) {
    SCOPED_TRACE(name);
    const std::string path = testing::TempDir() + "/" + name + "-synth.gguf";
    const testing::CommandResult r =
        RunCommand({BinDir() + "/thermocline", "synth", "-o", path, "--tokenizer-from",
                    Vocab(name), "--dim", "64", "--ffn", "128", "--layers", "1", "--heads", "2",
                    "--kv-heads", "1", "--context", "64"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto model = Model::Load(path);
    ASSERT_TRUE(model.ok()) << model.status();
    auto vocab = Tokenizer::Load(Vocab(name));
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    EXPECT_EQ((*model)->config().vocab_size, vocab->vocab_size());
    EXPECT_EQ((*model)->tokenizer().kind(), vocab->kind());

    const auto [text, want] = FirstCase(name);
    ASSERT_FALSE(text.empty());
    const std::string input = testing::TempDir() + "/case.txt";
    FILE* f = std::fopen(input.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    const testing::CommandResult tok = RunCommand(
        {"/bin/sh", "-c", BinDir() + "/thermocline tokenize --model " + path + " < " + input});
    ASSERT_EQ(tok.exit_code, 0) << tok.err;
    std::istringstream a(tok.out), b(want);
    std::vector<int> got_ids, want_ids;
    for (int x; a >> x;) got_ids.push_back(x);
    for (int x; b >> x;) want_ids.push_back(x);
    EXPECT_EQ(got_ids, want_ids);

    // generate adds BOS only where the vocabulary says so (llama-spm yes, gpt-2 and falcon no).
    const testing::CommandResult gen =
        RunCommand({BinDir() + "/thermocline", "generate", "-m", path, "-p", text, "-n", "1",
                    "-t", "0", "--threads", "1"});
    ASSERT_EQ(gen.exit_code, 0) << gen.err;
    const size_t with_bos = want_ids.size() + (vocab->add_bos_token() ? 1 : 0);
    EXPECT_NE(gen.err.find("prompt: " + std::to_string(with_bos) + " tokens"), std::string::npos)
        << gen.err;
    EXPECT_EQ(vocab->add_bos_token(), name == "llama-spm");

    // It runs: the ids go through the model and give one finite row per position.
    ThreadPool pool(1);
    auto kv = KvCache::Create((*model)->config(), 1, 64, GgmlType::kF32);
    ASSERT_TRUE(kv.ok());
    ForwardPass pass(**model, *kv, pool);
    std::vector<BatchEntry> batch;
    for (size_t p = 0; p < std::min<size_t>(want_ids.size(), 16); ++p) {
      batch.push_back({0, static_cast<int32_t>(p), want_ids[p], true});
    }
    std::vector<float> logits;
    ASSERT_TRUE(pass.Run(batch, logits).ok());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(SynthTokenizerFromTest, UnusableVocabularyIsRefusedNamingTheFlag) {
  const testing::CommandResult r = RunCommand(
      {BinDir() + "/thermocline", "synth", "-o", testing::TempDir() + "/x.gguf",
       "--tokenizer-from", testing::ModelPath("archs/ids32.txt")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--tokenizer-from"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace thermocline
