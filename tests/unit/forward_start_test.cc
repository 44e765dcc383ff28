// ForwardPass::set_start: a batch started at block l from the dense stream after block l - 1
// gives every later block's output and the logits bit for bit as the whole model does (what
// TEAL's calibration relies on to measure one block at a time); a start past the last block or
// a missing input is an error, not a crash.
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/util/thread_pool.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

TEST(ForwardStartTest, LaterBlocksAndLogitsAreTheWholeModelsBitForBit) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  auto model = Model::Load(testing::ModelPath("stories260K/stories260K.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  ASSERT_GE(c.n_layers, 3);
  std::vector<BatchEntry> batch;
  for (int32_t p = 0; p < 20; ++p) batch.push_back({0, p, (p * 37 + 11) % 500, p % 3 == 0});
  const int64_t n = static_cast<int64_t>(batch.size());
  ThreadPool pool(2);

  // The whole model, every block's output kept.
  std::vector<std::vector<float>> whole(c.n_layers);
  std::vector<float> whole_logits;
  {
    auto kv = KvCache::Create(c, 1, 32, GgmlType::kF32);
    ASSERT_TRUE(kv.ok());
    ForwardPass pass(**model, *kv, pool);
    pass.set_layer_observer([&](int64_t l, const float* x, int64_t rows) {
      whole[l].assign(x, x + rows * c.dim);
      return true;
    });
    ASSERT_TRUE(pass.Run(batch, whole_logits).ok());
  }
  for (int64_t start = 1; start < c.n_layers; ++start) {
    auto kv = KvCache::Create(c, 1, 32, GgmlType::kF32);  // no keys of the earlier blocks
    ASSERT_TRUE(kv.ok());
    ForwardPass pass(**model, *kv, pool);
    int64_t asked = 0;
    pass.set_start(start, [&](int64_t rows) {
      asked = rows;
      return whole[start - 1].data();
    });
    std::vector<int64_t> seen;
    pass.set_layer_observer([&](int64_t l, const float* x, int64_t rows) {
      seen.push_back(l);
      EXPECT_EQ(std::memcmp(x, whole[l].data(), rows * c.dim * sizeof(float)), 0)
          << "block " << l << " from block " << start;
      return true;
    });
    std::vector<float> logits;
    ASSERT_TRUE(pass.Run(batch, logits).ok());
    EXPECT_EQ(asked, n);
    ASSERT_EQ(seen.size(), static_cast<size_t>(c.n_layers - start));
    EXPECT_EQ(seen.front(), start);
    ASSERT_EQ(logits.size(), whole_logits.size());
    EXPECT_EQ(std::memcmp(logits.data(), whole_logits.data(), logits.size() * sizeof(float)), 0)
        << "from block " << start;
  }

  auto kv = KvCache::Create(c, 1, 32, GgmlType::kF32);
  ASSERT_TRUE(kv.ok());
  ForwardPass pass(**model, *kv, pool);
  std::vector<float> logits;
  pass.set_start(c.n_layers + 1, [&](int64_t) { return whole[0].data(); });
  const absl::Status past = pass.Run(batch, logits);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument) << past;
  EXPECT_NE(past.message().find("cannot start at block"), std::string::npos) << past;
  pass.set_start(1, [](int64_t) -> const float* { return nullptr; });
  const absl::Status none = pass.Run(batch, logits);
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument) << none;
  // Back to the whole model.
  pass.set_start(0, nullptr);
  ASSERT_TRUE(pass.Run(batch, logits).ok());
  EXPECT_EQ(std::memcmp(logits.data(), whole_logits.data(), logits.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace thermocline
