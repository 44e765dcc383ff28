// Damaged GGUF files must give an error, never a crash or an out-of-bounds read. Every image is
// parsed from a heap buffer of exactly its size, so AddressSanitizer (in the Asan build) flags a
// read even one byte past the end.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/gguf/quant.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

// A small file with every structure the parser knows: scalar, string, string-array, float-array
// and nested-array values, and tensors of three types.
std::string SmallFile() {
  GgufWriter w;
  w.SetValue("general.architecture", GgufString("llama"));
  w.SetValue("llama.block_count", GgufU32(2));
  w.SetValue("tokenizer.ggml.tokens", GgufStringArray({"<unk>", "<s>", "</s>", "▁the", "a"}));
  w.SetValue("tokenizer.ggml.scores", GgufF32Array({0.0f, 0.0f, 0.0f, -1.0f, -2.0f}));
  w.SetValue("test.flag", GgufBool(true));
  std::vector<GgufValue> rows;
  rows.push_back(GgufI32Array({1, 2}));
  rows.push_back(GgufI32Array({3}));
  w.SetValue("test.nested", GgufArrayOf(GgufValueType::kArray, std::move(rows)));
  auto add = [&](const char* name, GgmlType type, std::vector<int64_t> ne) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    std::string bytes(RowBytes(type, n), '\0');
    QuantizeRow(type, x.data(), bytes.data(), n);
    EXPECT_TRUE(w.AddTensorBytes(name, type, std::move(ne), bytes).ok());
  };
  add("b.weight", GgmlType::kQ8_0, {32, 2});
  add("c.weight", GgmlType::kQ4_0, {64});
  // Last, and a multiple of the alignment, so the file ends with tensor data rather than padding
  // and every truncation loses something.
  add("a.weight", GgmlType::kF32, {8, 2});
  const std::string path = testing::TempDir() + "/small.gguf";
  EXPECT_TRUE(w.WriteFile(path).ok());
  return testing::ReadFileOrDie(path);
}

// Reads every byte of every tensor and every metadata string, so that a bounds check that let a
// bad range through shows up as an ASan report.
uint64_t TouchEverything(const GgufFile& f) {
  uint64_t sum = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    for (int64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
  }
  for (const auto& [key, value] : f.metadata()) {
    sum += key.size();
    if (const GgufArray* a = value.AsArray()) {
      for (const GgufValue& item : a->items) {
        if (const std::string* s = item.AsString()) {
          for (char c : *s) sum += static_cast<uint8_t>(c);
        }
      }
    }
  }
  return sum;
}

struct Outcome {
  int parsed = 0;
  int rejected = 0;
};

// Parses `n` bytes from an exact-size heap copy.
void ParseCopy(const uint8_t* data, size_t n, Outcome& outcome, uint64_t& sink) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[n]);
  if (n > 0) std::memcpy(copy.get(), data, n);
  auto f = GgufFile::FromBuffer(copy.get(), n);
  if (f.ok()) {
    ++outcome.parsed;
    sink += TouchEverything(**f);
  } else {
    ++outcome.rejected;
    EXPECT_FALSE(f.status().message().empty());
  }
}

const uint8_t* U8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

TEST(GgufCorruptionTest, SmallFileTruncatedAtEveryOffset) {
  const std::string bytes = SmallFile();
  ASSERT_TRUE(GgufFile::FromBuffer(U8(bytes), bytes.size()).ok());
  uint64_t sink = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    Outcome o;
    ParseCopy(U8(bytes), n, o, sink);
    EXPECT_EQ(o.rejected, 1) << "truncated to " << n << " bytes";
  }
}

// Flips 1 to 4 bytes at random (uniform over [0, limit), or, half the time, within
// [hot_begin, hot_end)), parses the whole image, and restores. Flipped images that still parse
// are touched end to end.
Outcome RandomFlips(const std::string& bytes, size_t limit, size_t hot_begin, size_t hot_end,
                    int iterations, uint32_t seed) {
  std::mt19937 rng(seed);
  Outcome outcome;
  uint64_t sink = 0;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[bytes.size()]);
  std::memcpy(buf.get(), bytes.data(), bytes.size());
  for (int it = 0; it < iterations; ++it) {
    const int n_flips = 1 + static_cast<int>(rng() % 4);
    std::vector<std::pair<size_t, uint8_t>> saved;
    for (int k = 0; k < n_flips; ++k) {
      const bool hot = hot_end > hot_begin && rng() % 2 == 0;
      const size_t pos = hot ? hot_begin + rng() % (hot_end - hot_begin) : rng() % limit;
      saved.emplace_back(pos, buf[pos]);
      switch (rng() % 3) {
        case 0:
          buf[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:
          buf[pos] = static_cast<uint8_t>(rng());
          break;
        default:
          buf[pos] = (rng() % 2) ? 0xFF : 0x00;
          break;
      }
    }
    auto f = GgufFile::FromBuffer(buf.get(), bytes.size());
    if (f.ok()) {
      ++outcome.parsed;
      sink += TouchEverything(**f);
    } else {
      ++outcome.rejected;
    }
    for (auto it2 = saved.rbegin(); it2 != saved.rend(); ++it2) buf[it2->first] = it2->second;
  }
  EXPECT_NE(sink, 1u);  // keeps the reads from being optimized away
  return outcome;
}

TEST(GgufCorruptionTest, SmallFileRandomFlips) {
  const std::string bytes = SmallFile();
  auto f = GgufFile::FromBuffer(U8(bytes), bytes.size());
  ASSERT_TRUE(f.ok());
  const size_t data_offset = (*f)->data_offset();
  Outcome o = RandomFlips(bytes, bytes.size(), 0, data_offset, 20000, 12345);
  // Both outcomes occur: flips in tensor data or string bytes keep the file valid.
  EXPECT_GT(o.parsed, 0);
  EXPECT_GT(o.rejected, 0);
}

class StoriesCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = testing::ReadFileOrDie(testing::ModelPath("stories260K/stories260K.gguf"));
    auto f = GgufFile::FromBuffer(U8(bytes_), bytes_.size());
    ASSERT_TRUE(f.ok()) << f.status();
    data_offset_ = (*f)->data_offset();
    // The tensor infos start with the first tensor's name, preceded by its 8-byte length.
    const size_t name = bytes_.find("token_embd.weight");
    ASSERT_NE(name, std::string::npos);
    infos_begin_ = name - 8;
  }

  std::string bytes_;
  size_t data_offset_ = 0;
  size_t infos_begin_ = 0;
};

TEST_F(StoriesCorruptionTest, HeaderRegionTruncatedAtEveryOffset) {
  uint64_t sink = 0;
  Outcome o;
  for (size_t n = 0; n <= data_offset_; ++n) ParseCopy(U8(bytes_), n, o, sink);
  EXPECT_EQ(o.parsed, 0);
}

TEST_F(StoriesCorruptionTest, HeaderRegionRandomFlips) {
  // Half the flips land in the tensor infos, which are a small part of the header but hold the
  // shapes, types and offsets.
  Outcome o = RandomFlips(bytes_, data_offset_, infos_begin_, data_offset_, 2000, 777);
  EXPECT_GT(o.parsed, 0);
  EXPECT_GT(o.rejected, 0);
}

}  // namespace
}  // namespace thermocline
