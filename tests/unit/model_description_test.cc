// The gateway's view of a model, read from the file's header alone (no mapping, no weights):
// the same hyperparameters and tokenizer as a full load, for every architecture; a vocabulary
// whose header is larger than the first read still parses (the read grows).
#include <string>

#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.ffn_dim, b.ffn_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.context_length, b.context_length);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.rope_freq_base, b.rope_freq_base);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.attn_softcap, b.attn_softcap);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].sliding_window, b.layers[l].sliding_window);
    EXPECT_EQ(a.layers[l].moe, b.layers[l].moe);
  }
}

TEST(ModelDescriptionTest, HeaderAloneGivesTheFullLoadsConfigAndTokenizer) {
  for (const std::string name :
       {"archs/qwen2.gguf", "archs/gemma2.gguf", "archs/falcon.gguf", "archs/llama-moe.gguf",
        "archs/qwen2moe.gguf", "archs/phi3.gguf", "stories260K/stories260K.gguf"}) {
    SCOPED_TRACE(name);
    const std::string path = testing::ModelPath(name);
    auto full = Model::Load(path);
    ASSERT_TRUE(full.ok()) << full.status();
    auto d = ReadModelDescription(path);
    ASSERT_TRUE(d.ok()) << d.status();
    ExpectSameConfig(d->config, (*full)->config());
    const std::string text = "Once upon a time, a little girl";
    EXPECT_EQ(d->tokenizer.Encode(text, true), (*full)->tokenizer().Encode(text, true));
  }
}

TEST(ModelDescriptionTest, OpenHeaderMapsNothingAndGrowsItsRead) {
  // A 100k-token vocabulary: its header is several MiB, more than the first 1 MiB read.
  const std::string vocab = testing::SharedDataDir() + "/tokenizers/ggml-vocab-deepseek-llm.gguf";
  auto header = GgufFile::OpenHeader(vocab);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_TRUE((*header)->header_only());
  EXPECT_GT((*header)->file_size(), uint64_t{1} << 20);
  auto mapped = GgufFile::Open(vocab);
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ((*header)->metadata().size(), (*mapped)->metadata().size());
  EXPECT_EQ((*header)->file_size(), (*mapped)->file_size());
  // Tensors are described but carry no data pointer.
  auto model = GgufFile::OpenHeader(testing::ModelPath("archs/qwen2.gguf"));
  ASSERT_TRUE(model.ok());
  ASSERT_FALSE((*model)->tensors().empty());
  for (const GgufTensorInfo& t : (*model)->tensors()) EXPECT_EQ(t.data, nullptr) << t.name;
}

TEST(ModelDescriptionTest, TruncatedFileIsRefusedLikeAFullOpen) {
  const std::string src = testing::ReadFileOrDie(testing::ModelPath("archs/qwen2.gguf"));
  const std::string path = testing::TempDir() + "/cut.gguf";
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(src.data(), 1, src.size() / 2, f);
    std::fclose(f);
  }
  auto header = GgufFile::OpenHeader(path);
  ASSERT_FALSE(header.ok());
  EXPECT_NE(header.status().message().find("past end of file"), std::string::npos)
      << header.status();
  EXPECT_FALSE(ReadModelDescription(path).ok());
}

}  // namespace
}  // namespace thermocline
