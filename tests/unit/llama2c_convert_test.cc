#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/model/llama2c.h"
#include "shared/gguf/quant.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string StoriesBin() { return testing::ModelPath("stories260K/stories260K.bin"); }
std::string StoriesTok() { return testing::ModelPath("stories260K/tok512.bin"); }
std::string StoriesGguf() { return testing::ModelPath("stories260K/stories260K.gguf"); }
std::string AidreamsBin() { return testing::ModelPath("aidreams260K/aidreams260K.bin"); }
std::string AidreamsTok() { return testing::ModelPath("aidreams260K/tok512.bin"); }

std::unique_ptr<GgufFile> OpenOrDie(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) std::abort();
  return *std::move(f);
}

// Exact equality of two metadata values, floats compared bit for bit.
bool SameValue(const GgufValue& a, const GgufValue& b) {
  if (a.type() != b.type()) return false;
  if (const GgufArray* x = a.AsArray()) {
    const GgufArray* y = b.AsArray();
    if (x->element_type != y->element_type || x->items.size() != y->items.size()) return false;
    for (size_t i = 0; i < x->items.size(); ++i) {
      if (!SameValue(x->items[i], y->items[i])) return false;
    }
    return true;
  }
  if (const float* x = std::get_if<float>(&a.v)) {
    return std::memcmp(x, std::get_if<float>(&b.v), sizeof(float)) == 0;
  }
  if (const double* x = std::get_if<double>(&a.v)) {
    return std::memcmp(x, std::get_if<double>(&b.v), sizeof(double)) == 0;
  }
  if (a.AsString() != nullptr) return *a.AsString() == *b.AsString();
  return a.AsInt() == b.AsInt();
}

std::string Convert(const std::string& bin, const std::string& tok,
                    const Llama2cConvertOptions& options = {},
                    Llama2cConvertSummary* summary_out = nullptr) {
  const std::string out = testing::TempDir() + "/model.gguf";
  absl::StatusOr<Llama2cConvertSummary> summary = ConvertLlama2cToGguf(bin, tok, out, options);
  EXPECT_TRUE(summary.ok()) << summary.status();
  if (summary_out != nullptr && summary.ok()) *summary_out = *summary;
  return out;
}

TEST(Llama2cConvertTest, Stories260KMatchesShippedGguf) {
  Llama2cConvertSummary summary;
  const std::string path = Convert(StoriesBin(), StoriesTok(), {}, &summary);
  EXPECT_EQ(summary.n_tensors, 48);
  EXPECT_EQ(summary.n_parameters, 260032);
  EXPECT_EQ(summary.n_fallback_f16, 0);
  EXPECT_EQ(summary.config.seq_len, 512);

  std::unique_ptr<GgufFile> ours = OpenOrDie(path);
  std::unique_ptr<GgufFile> ref = OpenOrDie(StoriesGguf());

  // Every tensor: same name, order, type, shape and bytes.
  ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
  for (size_t i = 0; i < ref->tensors().size(); ++i) {
    const GgufTensorInfo& r = ref->tensors()[i];
    const GgufTensorInfo& o = ours->tensors()[i];
    EXPECT_EQ(o.name, r.name);
    EXPECT_EQ(o.type, r.type) << r.name;
    EXPECT_EQ(o.ne, r.ne) << r.name;
    ASSERT_EQ(o.n_bytes, r.n_bytes) << r.name;
    EXPECT_EQ(std::memcmp(o.data, r.data, r.n_bytes), 0) << r.name << " differs";
  }

  // Every key of the reference, with the same type and value, except the context length.
  for (const auto& [key, value] : ref->metadata()) {
    const GgufValue* mine = ours->FindValue(key);
    ASSERT_NE(mine, nullptr) << key;
    if (key == "llama.context_length") continue;
    EXPECT_TRUE(SameValue(*mine, value)) << key;
  }
  EXPECT_EQ(*ref->GetInt("llama.context_length"), 2048);
  EXPECT_EQ(*ours->GetInt("llama.context_length"), 512);
  EXPECT_EQ(*ours->GetDouble("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(*ours->GetInt("general.file_type"), 0);
  // The layout of the reference too: the keys in the same order, ours has two more at the end.
  ASSERT_EQ(ours->metadata().size(), ref->metadata().size() + 2);
  for (size_t i = 0; i < ref->metadata().size(); ++i) {
    EXPECT_EQ(ours->metadata()[i].first, ref->metadata()[i].first);
  }

  // The tokenizers agree too.
  absl::StatusOr<Tokenizer> t = Tokenizer::FromGguf(*ours);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->Encode("Once upon a time", true), ElementsAre(1, 403, 407, 261, 378));
}

TEST(Llama2cConvertTest, TensorsAreSlicesOfTheCheckpoint) {
  absl::StatusOr<Llama2cCheckpoint> ck = ReadLlama2cCheckpoint(StoriesBin());
  ASSERT_TRUE(ck.ok()) << ck.status();
  const Llama2cConfig& c = ck->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_EQ(ck->token_embedding.offset, 28);
  // Layer 4's w3 ends where rms_final begins; the RoPE tables follow it.
  EXPECT_EQ(ck->w3.offset + 5 * ck->w3.n_bytes(), ck->rms_final.offset);
  EXPECT_EQ(ck->rms_final.offset + 64 * 4 + 2 * 512 * 4 * 4,
            static_cast<int64_t>(ck->bytes.size()));
  EXPECT_EQ(ck->wcls.offset, ck->token_embedding.offset);
}

TEST(Llama2cConvertTest, Aidreams260KConvertsAndItsTokenizerRoundTrips) {
  Llama2cConvertSummary summary;
  const std::string path = Convert(AidreamsBin(), AidreamsTok(), {}, &summary);
  EXPECT_EQ(summary.n_tensors, 3 + 4 * 9);
  EXPECT_EQ(summary.n_parameters, 230976);
  std::unique_ptr<GgufFile> f = OpenOrDie(path);
  EXPECT_EQ(*f->GetInt("llama.context_length"), 128);
  EXPECT_EQ(*f->GetInt("llama.block_count"), 4);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count"), 4);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(*f->GetInt("llama.rope.dimension_count"), 16);
  const GgufTensorInfo* wk = f->FindTensor("blk.3.attn_k.weight");
  ASSERT_NE(wk, nullptr);
  EXPECT_THAT(wk->ne, ElementsAre(64, 64));
  const GgufTensorInfo* down = f->FindTensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_THAT(down->ne, ElementsAre(172, 64));

  // token_embd is the first array of the checkpoint, and output.weight a copy of it.
  const std::string bin = testing::ReadFileOrDie(AidreamsBin());
  const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
  const GgufTensorInfo* out = f->FindTensor("output.weight");
  ASSERT_NE(emb, nullptr);
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(emb->n_bytes, 512 * 64 * 4);
  EXPECT_EQ(std::memcmp(emb->data, bin.data() + 28, emb->n_bytes), 0);
  EXPECT_EQ(std::memcmp(out->data, bin.data() + 28, out->n_bytes), 0);

  absl::StatusOr<Tokenizer> t = Tokenizer::FromGguf(*f);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->Encode("I dreamed", true), ElementsAre(1, 303, 281, 269, 435, 447, 328));
  for (const std::string s : {"I dreamed, as I sense the nodes, a gentle hum of probability.",
                              "  spaced  out \n\n text ", "\xCE\xBB \xE6\x97\xA5 \xF0\x9F\x99\x82"}) {
    EXPECT_EQ(t->Decode(t->Encode(s, true)), s);
  }
}

TEST(Llama2cConvertTest, VocabularyMapping) {
  absl::StatusOr<Llama2cVocab> v = ReadLlama2cTokenizer(StoriesTok(), 512);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->max_token_length, 7u);
  EXPECT_EQ(v->texts[1], "\n<s>\n");
  EXPECT_EQ(v->texts[403], " Once");
  absl::StatusOr<GgufVocab> g = Llama2cVocabToGguf(*v);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->pieces[0], "<unk>");
  EXPECT_EQ(g->pieces[1], "<s>");
  EXPECT_EQ(g->pieces[2], "</s>");
  EXPECT_EQ(g->pieces[3], "<0x00>");
  EXPECT_EQ(g->pieces[403], "\xE2\x96\x81Once");
  EXPECT_EQ(g->types[0], TokenType::kUnknown);
  EXPECT_EQ(g->types[1], TokenType::kControl);
  EXPECT_EQ(g->types[2], TokenType::kControl);
  EXPECT_EQ(g->types[3], TokenType::kByte);
  EXPECT_EQ(g->types[258], TokenType::kByte);
  EXPECT_EQ(g->types[259], TokenType::kNormal);
  EXPECT_EQ(g->scores[260], -1.0f);
  EXPECT_TRUE(std::signbit(g->scores[259]));  // -0.0 kept bit for bit
}

// A synthetic checkpoint: the header, then every float array filled with a running counter so
// that each tensor's bytes identify where they came from.
std::string MakeCheckpoint(int32_t dim, int32_t hidden, int32_t layers, int32_t heads,
                           int32_t kv_heads, int32_t vocab, int32_t seq_len) {
  const int64_t kv = static_cast<int64_t>(dim) / heads * kv_heads;
  const int64_t v = vocab < 0 ? -static_cast<int64_t>(vocab) : vocab;
  int64_t n = v * dim + layers * (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hidden * dim) +
              dim + seq_len * (dim / heads);
  if (vocab < 0) n += v * dim;
  std::string bytes(28 + n * 4, '\0');
  const int32_t h[7] = {dim, hidden, layers, heads, kv_heads, vocab, seq_len};
  std::memcpy(bytes.data(), h, 28);
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(i) * 0.001f - 1.0f;
    std::memcpy(bytes.data() + 28 + i * 4, &x, 4);
  }
  return bytes;
}

// A llama2.c tokenizer of `n` tokens in the usual layout (needs n >= 259).
std::string MakeTokenizer(int n) {
  std::string out(4, '\0');
  const uint32_t max_len = 7;
  std::memcpy(out.data(), &max_len, 4);
  for (int id = 0; id < n; ++id) {
    std::string text;
    if (id == 0) {
      text = "<unk>";
    } else if (id == 1) {
      text = "\n<s>\n";
    } else if (id == 2) {
      text = "\n</s>\n";
    } else if (id < 259) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", id - 3);
      text = buf;
    } else {
      text = std::string(1, ' ') + static_cast<char>('a' + (id - 259) % 26);
    }
    const float score = id < 259 ? 0.0f : -static_cast<float>(id - 259);
    const uint32_t len = static_cast<uint32_t>(text.size());
    out.append(reinterpret_cast<const char*>(&score), 4);
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += text;
  }
  return out;
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TempDir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return path;
}

std::string CheckpointError(const std::string& bytes) {
  absl::StatusOr<Llama2cCheckpoint> ck = ParseLlama2cCheckpoint(bytes);
  EXPECT_FALSE(ck.ok());
  return std::string(ck.status().message());
}

TEST(Llama2cConvertTest, UnsharedClassifier) {
  const std::string model = WriteTemp("unshared.bin", MakeCheckpoint(32, 64, 2, 4, 2, -300, 16));
  const std::string tok = WriteTemp("tok300.bin", MakeTokenizer(300));
  Llama2cConvertSummary summary;
  const std::string path = Convert(model, tok, {}, &summary);
  EXPECT_EQ(summary.n_tensors, 3 + 2 * 9);
  absl::StatusOr<Llama2cCheckpoint> ck = ReadLlama2cCheckpoint(model);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_FALSE(ck->config.shared_classifier);
  EXPECT_EQ(ck->config.vocab_size, 300);
  EXPECT_EQ(summary.n_parameters,
            static_cast<int64_t>(ck->bytes.size() - 28) / 4 - 2 * 16 * 4 /* RoPE tables */);

  std::unique_ptr<GgufFile> f = OpenOrDie(path);
  const GgufTensorInfo* out = f->FindTensor("output.weight");
  const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
  ASSERT_NE(out, nullptr);
  ASSERT_NE(emb, nullptr);
  EXPECT_THAT(out->ne, ElementsAre(32, 300));
  const std::string_view wcls = ck->Slice(ck->wcls, 0);
  ASSERT_EQ(static_cast<size_t>(out->n_bytes), wcls.size());
  EXPECT_EQ(std::memcmp(out->data, wcls.data(), wcls.size()), 0);
  EXPECT_EQ(ck->wcls.offset + ck->wcls.n_bytes(), static_cast<int64_t>(ck->bytes.size()));
  EXPECT_NE(std::memcmp(out->data, emb->data, emb->n_bytes), 0);
  // A per-layer tensor of the last layer comes from the right place.
  const GgufTensorInfo* w2 = f->FindTensor("blk.1.ffn_down.weight");
  ASSERT_NE(w2, nullptr);
  EXPECT_THAT(w2->ne, ElementsAre(64, 32));
  EXPECT_EQ(std::memcmp(w2->data, ck->Slice(ck->w2, 1).data(), w2->n_bytes), 0);
}

TEST(Llama2cConvertTest, RejectsBadHeaders) {
  EXPECT_THAT(CheckpointError(std::string(27, '\0')), HasSubstr("28-byte header"));
  EXPECT_THAT(CheckpointError(MakeCheckpoint(64, 172, 5, 8, 4, 512, 512).substr(0, 28)),
              HasSubstr("implies 1056540 bytes"));
  EXPECT_THAT(CheckpointError(MakeCheckpoint(30, 16, 1, 4, 4, 8, 4)),
              HasSubstr("dim 30 is not a multiple of n_heads 4"));
  EXPECT_THAT(CheckpointError(MakeCheckpoint(32, 16, 1, 4, 3, 8, 4)),
              HasSubstr("n_heads 4 is not a multiple of n_kv_heads 3"));
  EXPECT_THAT(CheckpointError(MakeCheckpoint(32, 16, 1, 4, 8, 8, 4)),
              HasSubstr("n_heads 4 is not a multiple of n_kv_heads 8"));
  EXPECT_THAT(CheckpointError(MakeCheckpoint(12, 16, 1, 4, 4, 8, 4)),
              HasSubstr("head size 3"));

  auto with_header = [](std::vector<int32_t> h) {
    std::string b(28 + 64, '\0');
    std::memcpy(b.data(), h.data(), 28);
    return b;
  };
  EXPECT_THAT(CheckpointError(with_header({0, 16, 1, 4, 4, 8, 4})), HasSubstr("dim is 0"));
  EXPECT_THAT(CheckpointError(with_header({32, -16, 1, 4, 4, 8, 4})),
              HasSubstr("hidden_dim is -16"));
  EXPECT_THAT(CheckpointError(with_header({32, 16, 0, 4, 4, 8, 4})), HasSubstr("n_layers is 0"));
  EXPECT_THAT(CheckpointError(with_header({32, 16, 1, -4, 4, 8, 4})),
              HasSubstr("n_heads is -4"));
  EXPECT_THAT(CheckpointError(with_header({32, 16, 1, 4, 0, 8, 4})),
              HasSubstr("n_kv_heads is 0"));
  EXPECT_THAT(CheckpointError(with_header({32, 16, 1, 4, 4, 0, 4})),
              HasSubstr("vocab_size is 0"));
  EXPECT_THAT(CheckpointError(with_header({32, 16, 1, 4, 4, INT32_MIN, 4})),
              HasSubstr("vocab_size is -2147483648"));
  EXPECT_THAT(CheckpointError(with_header({32, 16, 1, 4, 4, 8, 0})), HasSubstr("seq_len is 0"));
  EXPECT_THAT(CheckpointError(with_header({0x616b3432, 1, 0, 0, 0, 0, 0})),
              HasSubstr("version 0"));
  // Sizes that overflow 64 bits are an error, not a wrap-around.
  EXPECT_THAT(CheckpointError(with_header({INT32_MAX - 1, INT32_MAX, INT32_MAX, 1, 1, INT32_MAX,
                                           INT32_MAX})),
              HasSubstr("more data than any file can hold"));
}

TEST(Llama2cConvertTest, RejectsWrongSizes) {
  const std::string good = testing::ReadFileOrDie(StoriesBin());
  ASSERT_TRUE(ParseLlama2cCheckpoint(good).ok());
  EXPECT_THAT(CheckpointError(good.substr(0, good.size() - 4)),
              HasSubstr("1056536 bytes but its header"));
  EXPECT_THAT(CheckpointError(good.substr(0, good.size() - 4)), HasSubstr("truncated"));
  EXPECT_THAT(CheckpointError(good + "x"), HasSubstr("implies 1056540 bytes"));
  // A positive vocab_size with the wcls array present (or the reverse) gets a pointed hint.
  const std::string shared = MakeCheckpoint(32, 64, 2, 4, 2, 300, 16);
  std::string unshared = MakeCheckpoint(32, 64, 2, 4, 2, -300, 16);
  const int32_t positive = 300;
  std::memcpy(unshared.data() + 20, &positive, 4);
  EXPECT_THAT(CheckpointError(unshared), HasSubstr("a positive vocab_size says is absent"));
  std::string flipped = shared;
  const int32_t negative = -300;
  std::memcpy(flipped.data() + 20, &negative, 4);
  EXPECT_THAT(CheckpointError(flipped), HasSubstr("a negative vocab_size says is present"));

  absl::StatusOr<Llama2cCheckpoint> missing = ReadLlama2cCheckpoint("/nonexistent/model.bin");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/model.bin"));
}

TEST(Llama2cConvertTest, EveryTruncatedCheckpointIsAnError) {
  const std::string good = MakeCheckpoint(32, 64, 2, 4, 2, 300, 16);
  for (size_t n = 0; n < good.size(); n += 97) {
    EXPECT_FALSE(ParseLlama2cCheckpoint(good.substr(0, n)).ok()) << n;
  }
}

std::string TokenizerError(const std::string& bytes, int32_t vocab) {
  absl::StatusOr<Llama2cVocab> v = ParseLlama2cTokenizer(bytes, vocab);
  EXPECT_FALSE(v.ok());
  return std::string(v.status().message());
}

TEST(Llama2cConvertTest, RejectsBadTokenizers) {
  const std::string good = testing::ReadFileOrDie(StoriesTok());
  ASSERT_TRUE(ParseLlama2cTokenizer(good, 512).ok());
  // Every truncation is an error, never a crash.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(ParseLlama2cTokenizer(std::string_view(good).substr(0, n), 512).ok()) << n;
  }
  EXPECT_THAT(TokenizerError(good.substr(0, good.size() - 1), 512), HasSubstr("token 511"));
  EXPECT_THAT(TokenizerError(good + "xyz", 512), HasSubstr("3 bytes after its 512 tokens"));
  EXPECT_THAT(TokenizerError(good, 511), HasSubstr("after its 511 tokens"));
  EXPECT_THAT(TokenizerError(good, 513), HasSubstr("token 512"));
  EXPECT_THAT(TokenizerError(good, 100000), HasSubstr("too short for 100000 tokens"));
  EXPECT_THAT(TokenizerError(good, 0), HasSubstr("vocab_size 0"));

  std::string long_token = good;
  const uint32_t len = 8;  // token 0 claims 8 bytes, more than max_token_length 7
  std::memcpy(long_token.data() + 8, &len, 4);
  EXPECT_THAT(TokenizerError(long_token, 512), HasSubstr("token 0 at byte 4 has length 8"));
  std::string huge = good;
  const uint32_t huge_len = 0xFFFFFFF0u;
  std::memcpy(huge.data(), &huge_len, 4);  // max_token_length no longer limits it
  std::memcpy(huge.data() + 8, &huge_len, 4);
  EXPECT_THAT(TokenizerError(huge, 512), HasSubstr("truncated"));
  std::string nan_score = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_score.data() + 4, &nan, 4);
  EXPECT_THAT(TokenizerError(nan_score, 512), HasSubstr("NaN"));
  std::string zero_max = good;
  std::memset(zero_max.data(), 0, 4);
  EXPECT_THAT(TokenizerError(zero_max, 512), HasSubstr("max_token_length"));

  // Converting with a tokenizer of another size fails with both numbers in the message.
  const std::string tok = WriteTemp("tok511.bin", MakeTokenizer(511));
  absl::StatusOr<Llama2cConvertSummary> s =
      ConvertLlama2cToGguf(StoriesBin(), tok, testing::TempDir() + "/x.gguf", {});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("512"));
  EXPECT_THAT(s.status().message(), HasSubstr("tok511.bin"));
}

TEST(Llama2cConvertTest, QuantizedConversion) {
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0}) {
    Llama2cConvertOptions options;
    options.type = type;
    Llama2cConvertSummary summary;
    const std::string path = Convert(StoriesBin(), StoriesTok(), options, &summary);
    // ffn_down rows have 172 values, not a whole number of 32-blocks.
    EXPECT_EQ(summary.n_fallback_f16, type == GgmlType::kQ8_0 ? 5 : 0);
    std::unique_ptr<GgufFile> f = OpenOrDie(path);
    std::unique_ptr<GgufFile> ref = OpenOrDie(StoriesGguf());
    EXPECT_EQ(*f->GetInt("general.file_type"), type == GgmlType::kQ8_0 ? 7 : 1);
    for (const GgufTensorInfo& r : ref->tensors()) {
      const GgufTensorInfo* t = f->FindTensor(r.name);
      ASSERT_NE(t, nullptr) << r.name;
      EXPECT_EQ(t->ne, r.ne);
      GgmlType want = type;
      if (r.ne.size() == 1) want = GgmlType::kF32;
      if (r.ne[0] % 32 != 0 && type == GgmlType::kQ8_0) want = GgmlType::kF16;
      ASSERT_EQ(t->type, want) << r.name;
      // Each row is the reference row converted with QuantizeRow.
      const int64_t cols = r.ne[0];
      const int64_t rows = r.n_elements / cols;
      const int64_t row_bytes = RowBytes(want, cols);
      ASSERT_EQ(t->n_bytes, rows * row_bytes) << r.name;
      std::vector<uint8_t> expected(row_bytes);
      std::vector<float> row(cols);
      for (int64_t i = 0; i < rows; ++i) {
        std::memcpy(row.data(), r.data + i * cols * 4, cols * 4);
        QuantizeRow(want, row.data(), expected.data(), cols);
        ASSERT_EQ(std::memcmp(t->data + i * row_bytes, expected.data(), row_bytes), 0)
            << r.name << " row " << i;
      }
    }
  }
}

TEST(Llama2cConvertTest, CommandLine) {
  const std::string bin = testing::BinDir() + "/thermocline";
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << "thermocline binary not built: " << bin;
  const std::string out = testing::TempDir() + "/cli.gguf";
  testing::CommandResult r =
      testing::RunCommand({bin, "convert", "--from", "llama2c", StoriesBin(), StoriesTok(), "-o",
                           out, "--type", "q8_0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("48 tensors"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  std::unique_ptr<GgufFile> f = OpenOrDie(out);
  EXPECT_EQ(f->FindTensor("blk.0.attn_q.weight")->type, GgmlType::kQ8_0);

  r = testing::RunCommand({bin, "convert", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--type"));

  r = testing::RunCommand({bin, "convert", "--from", "llama2c", StoriesBin(),
                           testing::ModelPath("aidreams260K/aidreams260K.bin"), "-o", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("aidreams260K.bin"));

  r = testing::RunCommand({bin, "convert", "--from", "llama2c", StoriesBin(), StoriesTok(), "-o",
                           out, "--type", "q3_k"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("q3_k"));

  r = testing::RunCommand({bin, "convert", "--from", "safetensors", StoriesBin(), StoriesTok(),
                           "-o", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("safetensors"));
}

}  // namespace
}  // namespace thermocline
