// A file whose metadata disagrees with its tensors does not load silently (issue [5/7] item 6):
// a block_count smaller than the blocks stored is refused naming the tensors it would ignore, a
// stray tensor is refused by name, and a context length of 2^31 (valid as a key) is refused by
// the KV cache with the bytes it would need instead of overflowing or aborting in the allocator.
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"
#include "shared/runtime/kv_cache.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

// Writes a copy of `src` with metadata `overrides` applied and `extra` appended as an F32 tensor.
std::string Rewrite(const std::string& src, const std::vector<std::pair<std::string, GgufValue>>& overrides,
                    const std::string& extra = "", const std::string& nan_in = "") {
  auto file = GgufFile::Open(src);
  EXPECT_TRUE(file.ok()) << file.status();
  GgufWriter w;
  for (const auto& [key, value] : (*file)->metadata()) {
    bool replaced = false;
    for (const auto& [k, v] : overrides) replaced |= k == key;
    if (!replaced) w.SetValue(key, value);
  }
  for (const auto& [k, v] : overrides) w.SetValue(k, v);
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    std::string bytes(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.n_bytes));
    if (t.name == nan_in) {  // one f32 element: a NaN weight
      EXPECT_EQ(t.type, GgmlType::kF32);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(bytes.data(), &nan, sizeof(nan));
    }
    EXPECT_TRUE(w.AddTensorBytes(t.name, t.type, t.ne, bytes).ok());
  }
  if (!extra.empty()) {
    const std::vector<float> zeros(64, 0.0f);
    const std::string_view bytes(reinterpret_cast<const char*>(zeros.data()), zeros.size() * 4);
    EXPECT_TRUE(w.AddTensorBytes(extra, GgmlType::kF32, {64}, bytes).ok());
  }
  const std::string out = testing::TempDir() + "/rewritten.gguf";
  EXPECT_TRUE(w.WriteFile(out).ok());
  return out;
}

TEST(ModelConsistencyTest, BlockCountBelowTheStoredBlocksIsRefused) {
  // qwen2.gguf stores 2 blocks; saying 1 would silently drop the second.
  const std::string path = Rewrite(testing::ModelPath("archs/qwen2.gguf"), {{"qwen2.block_count", GgufU32(1)}});
  auto model = Model::Load(path);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("does not use"), std::string::npos) << model.status();
  EXPECT_NE(model.status().message().find("blk.1."), std::string::npos) << model.status();
}

TEST(ModelConsistencyTest, BlockCountAboveTheStoredBlocksIsRefused) {
  const std::string path = Rewrite(testing::ModelPath("archs/qwen2.gguf"), {{"qwen2.block_count", GgufU32(3)}});
  auto model = Model::Load(path);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("blk.2."), std::string::npos) << model.status();
  EXPECT_NE(model.status().message().find("missing"), std::string::npos) << model.status();
}

TEST(ModelConsistencyTest, StrayTensorIsRefusedByName) {
  const std::string path = Rewrite(testing::ModelPath("archs/falcon.gguf"), {}, "blk.0.ffn_norm.weight");
  auto model = Model::Load(path);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("blk.0.ffn_norm.weight"), std::string::npos) << model.status();
}

TEST(ModelConsistencyTest, HugeContextIsRefusedWithTheBytesNeeded) {
  const std::string path = Rewrite(testing::ModelPath("archs/qwen2.gguf"),
                                   {{"qwen2.context_length", GgufU32(uint32_t{1} << 31)}});
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().context_length, int64_t{1} << 31);
  auto kv = KvCache::Create((*model)->config(), 5, int64_t{1} << 31, GgmlType::kF32);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(kv.status().message().find("GiB for 5 slots x 2147483648 positions"), std::string::npos)
      << kv.status();
  EXPECT_NE(kv.status().message().find("--context"), std::string::npos) << kv.status();
  // A capacity the machine holds still works.
  EXPECT_TRUE(KvCache::Create((*model)->config(), 5, 64, GgmlType::kF32).ok());
}

// One NaN in one ffn_down is refused at load by the tensor check, naming the tensor, its layer
// and the element (the default for a file this small; it used to serve <unk> with status OK).
TEST(ModelConsistencyTest, NanWeightIsRefusedAtLoadNamingTheTensorAndLayer) {
  const std::string path =
      Rewrite(testing::ModelPath("archs/qwen2.gguf"), {}, "", "blk.0.ffn_down.weight");
  for (TensorCheck check : {TensorCheck::kAuto, TensorCheck::kOn}) {
    auto model = Model::Load(path, check);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(model.status().message());
    EXPECT_NE(msg.find("'blk.0.ffn_down.weight' (layer 0) holds NaN at row 0, column 0"),
              std::string::npos)
        << msg;
  }
  EXPECT_TRUE(TensorCheckFromName("on").ok());
  EXPECT_FALSE(TensorCheckFromName("yes").ok());
}

// Without the matrix check, the same NaN fails generation with an error naming non-finite
// logits (issue [5/7] item 5), where it used to sample token 0 and report success.
TEST(ModelConsistencyTest, NanWeightFailsGenerationInsteadOfSamplingTokenZero) {
  const std::string path =
      Rewrite(testing::ModelPath("archs/qwen2.gguf"), {}, "", "blk.0.ffn_down.weight");
  auto model = Model::Load(path, TensorCheck::kOff);
  ASSERT_TRUE(model.ok()) << model.status();
  ThreadPool pool(1);
  auto kv = KvCache::Create((*model)->config(), 1, 32, GgmlType::kF32);
  ASSERT_TRUE(kv.ok());
  ForwardPass pass(**model, *kv, pool);
  GenerationRequest req;
  req.prompt = {1, 385, 328, 432};
  req.max_new_tokens = 4;
  req.sampling.temperature = 0;
  int emitted = 0;
  auto stats = Generate(pass, req, [&](int32_t, std::span<const float>) { return ++emitted > 0; });
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(stats.status().message().find("not finite"), std::string::npos) << stats.status();
  EXPECT_EQ(emitted, 0);
}

}  // namespace
}  // namespace thermocline
