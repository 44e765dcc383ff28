// The shaped ReLU design (docs/synthetic-models.md) on the architectures besides llama that it
// fits (qkv biases, q/k norms, NeoX RoPE, fused [gate | up], sliding windows; LayerNorm and
// gateless MLPs, parallel blocks): measured through the real forward pass over text, each layer
// is about 1 - active_fraction sparse, as llama's is.
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/model/synth.h"
#include "shared/runtime/corpus.h"
#include "shared/runtime/ffn.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

// Per layer, the share of neurons with gate > 0, summed over tokens.
class ActiveShare final : public FfnObserver {
 public:
  ActiveShare(int64_t layers, int64_t ffn) : ffn_(ffn), sum_(layers, 0.0), tokens_(layers, 0) {}
  void OnFfn(int64_t layer, const float*, const float* gate, const float*,
             int64_t n_tokens) override {
    for (int64_t t = 0; t < n_tokens; ++t) {
      int64_t active = 0;
      for (int64_t i = 0; i < ffn_; ++i) active += gate[t * ffn_ + i] > 0;
      sum_[layer] += static_cast<double>(active) / ffn_;
      ++tokens_[layer];
    }
  }
  double share(int64_t layer) const { return sum_[layer] / tokens_[layer]; }

 private:
  int64_t ffn_;
  std::vector<double> sum_;
  std::vector<int64_t> tokens_;
};

class ShapedArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShapedArchTest, SparsityFollowsTheActiveFraction) {
  SynthOptions o;
  o.arch = GetParam();
  o.ffn_kind = SynthFfnKind::kReluGated;
  o.dim = 256;
  o.ffn = 1024;
  o.layers = 3;
  o.heads = 8;
  o.kv_heads = 4;
  o.vocab = 512;
  o.context = 256;
  o.active_fraction = 0.1;
  o.seed = 7;
  o.threads = 2;
  const std::string path = testing::TempDir() + "/shaped_" + o.arch + ".gguf";
  ASSERT_TRUE(WriteSynthModel(o, path).ok());
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  ASSERT_EQ(c.activation, FfnActivation::kRelu);
  auto tokens =
      TokenizeCorpusFile(testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt",
                         (*model)->tokenizer(), 1000);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ThreadPool pool(2);
  auto kv = KvCache::Create(c, 1, 256, GgmlType::kF32);
  ASSERT_TRUE(kv.ok()) << kv.status();
  DenseFfn ffn(**model, pool);
  ActiveShare observer(c.n_layers, c.ffn_dim);
  ffn.set_observer(&observer);
  ForwardPass pass(**model, *kv, pool, &ffn);
  CorpusWindowOptions wo;
  wo.window = 256;
  wo.want_logits = false;
  ASSERT_TRUE(RunCorpusWindows(pass, *tokens, wo, [](auto, auto) {}).ok());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::printf("%s layer %lld: sparsity %.4f\n", o.arch.c_str(), static_cast<long long>(l),
                1 - observer.share(l));
    // llama's test model is 0.898-0.908 sparse per layer at this fraction; unshaped ReLU
    // weights would be about 0.5.
    EXPECT_NEAR(1 - observer.share(l), 0.9, 0.03) << o.arch << " layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ShapedArchTest,
                         ::testing::Values("mistral", "bamboo", "qwen2", "qwen3", "phi3", "falcon",
                                           "starcoder2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace thermocline
