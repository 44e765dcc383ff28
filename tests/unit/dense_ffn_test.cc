// DenseFfn against the FFN's formula written out here (MatMul gate and up, the activation over
// all values at once on one thread, MatMul down), bit for bit at every pool size: the
// activation is split over the pool for a batch (ffn.cc), and an element-wise split must not
// change a value.
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "shared/kernels/matmul.h"
#include "shared/model/synth.h"
#include "shared/runtime/ffn.h"
#include "shared/util/thread_pool.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

TEST(DenseFfnTest, EqualsTheFormulaBitForBitAtEveryPoolSize) {
  for (SynthFfnKind kind : {SynthFfnKind::kSwiGlu, SynthFfnKind::kReluGated}) {
    auto model = testing::SmallSynthModel(GgmlType::kF32, kind);
    ASSERT_TRUE(model);
    const ModelConfig& c = model->config();
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // 32 tokens x 160 neurons is above the split's threshold; one token is not.
    for (int64_t n_tokens : {1, 32}) {
      std::vector<float> h(n_tokens * c.dim);
      for (float& v : h) v = normal(rng);
      for (int64_t l = 0; l < c.n_layers; ++l) {
        const LayerWeights& w = model->layer(l);
        ASSERT_FALSE(w.gate.empty());
        ASSERT_FALSE(w.has_down_t);
        ThreadPool one(1);
        std::vector<float> gate(n_tokens * c.ffn_dim), up(n_tokens * c.ffn_dim);
        MatMul(w.gate, h.data(), n_tokens, c.dim, gate.data(), c.ffn_dim, one);
        MatMul(w.up, h.data(), n_tokens, c.dim, up.data(), c.ffn_dim, one);
        GatedActivate(c.activation, gate.data(), up.data(), n_tokens * c.ffn_dim);
        std::vector<float> want(n_tokens * c.dim);
        MatMul(w.down, gate.data(), n_tokens, c.ffn_dim, want.data(), c.dim, one);
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          DenseFfn ffn(*model, pool);
          std::vector<float> got(n_tokens * c.dim, -1.0f);
          ffn.Compute(l, h.data(), n_tokens, got.data());
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
              << "kind " << static_cast<int>(kind) << " layer " << l << " tokens " << n_tokens
              << " threads " << threads;
        }
      }
    }
  }
}

}  // namespace
}  // namespace thermocline
