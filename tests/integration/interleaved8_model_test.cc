// The interleaved Q4_0, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS copies at load (THERMOCLINE_REPACK,
// Model::InterleaveDenseMatrices, shared/gguf/interleaved8.h) on llama.cpp's own Q4_0, Q4_K_M,
// Q4_K_S, Q5_K_M, Q5_K_S, IQ4_XS, pure-IQ4_XS, Q3_K_M and pure-Q3_K files of
// ../shared/models/quants/: which matrices get them, and that the model's logits and greedy picks
// with them are those without them, up to the bounds below.
//
// The bounds are quant_models_test.cc's, for the same reason: both runs multiply the same
// operands (Q8_0- or Q8_K-rounded activations, exact integer block sums) and differ only in f32
// summation order (q4_0x8_test.cc and kquant_x8_test.cc bound one product), which the network
// passes on at well below 1e-4 per logit (kExactBound); except that an f32 difference of ~1e-7
// relative can move an activation lying at a .5 boundary of its int8 rounding onto the other
// integer, after which the logits differ by up to a few 1e-2 (kQ8ActivationBound). The first
// prompt row, whose attention sees one position, must agree to kExactBound; greedy picks must
// agree wherever the row layout's top-2 gap exceeds twice the wider bound (both runs are fed the
// row layout's picks, so every step stays comparable).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/interleaved8.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/util/thread_pool.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

constexpr float kExactBound = 1e-4f;
constexpr float kQ8ActivationBound = 6e-2f;

std::unique_ptr<Model> LoadWithRepack(const std::string& path, const char* repack) {
  setenv("THERMOCLINE_REPACK", repack, 1);
  auto model = Model::Load(path);
  unsetenv("THERMOCLINE_REPACK");
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

int32_t ArgMax(const float* v, int64_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) best = v[i] > v[best] ? i : best;
  return best;
}

float Gap(const float* v, int64_t n) {
  const int32_t top = ArgMax(v, n);
  float second = -INFINITY;
  for (int32_t i = 0; i < n; ++i) {
    if (i != top) second = std::max(second, v[i]);
  }
  return v[top] - second;
}

float MaxDiff(const float* a, const float* b, int64_t n) {
  float d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

std::vector<int32_t> PromptIds() {
  std::istringstream in(testing::ReadFileOrDie(testing::ModelPath("quants/ids32.txt")));
  std::vector<int32_t> ids;
  int32_t x;
  while (in >> x) ids.push_back(x);
  return ids;
}

void CompareWithRowLayout(const std::string& path, bool ffn);

class Interleaved8ModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { THERMOCLINE_REQUIRE_SHARED_DATA(); }
};

TEST_P(Interleaved8ModelTest, OnlyDenseMatricesOfInterleavedTypesAreInterleaved) {
  const std::string path = testing::ModelPath("quants/" + GetParam() + ".gguf");
  const std::unique_ptr<Model> off = LoadWithRepack(path, "0");
  const std::unique_ptr<Model> on = LoadWithRepack(path, "1");
  ASSERT_TRUE(off && on);
  EXPECT_EQ(off->interleaved_bytes(), 0);
  int64_t expected = 0;
  auto check = [&](const MatrixView& m, bool dense_only, const std::string& what) {
    const bool want = dense_only && HasInterleaved8Layout(m.type);
    EXPECT_EQ(m.interleaved != nullptr, want) << what;
    if (want) expected += Interleaved8Bytes(m.type, m.rows, m.cols);
  };
  for (int64_t l = 0; l < on->config().n_layers; ++l) {
    const LayerWeights& w = on->layer(l);
    const std::string p = "layer " + std::to_string(l);
    check(w.wq, true, p + " wq");
    check(w.wk, true, p + " wk");
    check(w.wv, true, p + " wv");
    check(w.wo, true, p + " wo");
    // The FFN is gathered by neuron in the sparse modes: not at load (InterleaveDenseFfn).
    check(w.gate, false, p + " gate");
    check(w.up, false, p + " up");
    check(w.down, false, p + " down");
  }
  check(on->output(), !on->output_tied(), "output");
  check(on->token_embd(), false, "token_embd");  // single rows: the embedding lookup
  EXPECT_GT(expected, 0);
  EXPECT_EQ(on->interleaved_bytes(), expected);
}

TEST_P(Interleaved8ModelTest, DenseFfnIsInterleavedOnRequest) {
  const std::string path = testing::ModelPath("quants/" + GetParam() + ".gguf");
  const std::unique_ptr<Model> on = LoadWithRepack(path, "1");
  ASSERT_TRUE(on);
  const int64_t at_load = on->interleaved_bytes();
  ASSERT_TRUE(on->InterleaveDenseFfn().ok());
  int64_t ffn = 0;
  for (int64_t l = 0; l < on->config().n_layers; ++l) {
    for (const MatrixView* m : {&on->layer(l).gate, &on->layer(l).up, &on->layer(l).down}) {
      const bool want = HasInterleaved8Layout(m->type);
      EXPECT_EQ(m->interleaved != nullptr, want) << "layer " << l;
      if (want) ffn += Interleaved8Bytes(m->type, m->rows, m->cols);
    }
  }
  EXPECT_GT(ffn, 0);
  EXPECT_EQ(on->interleaved_bytes(), at_load + ffn);
  ASSERT_TRUE(on->InterleaveDenseFfn().ok());  // once only
  EXPECT_EQ(on->interleaved_bytes(), at_load + ffn);

  const std::unique_ptr<Model> off = LoadWithRepack(path, "0");
  ASSERT_TRUE(off);
  setenv("THERMOCLINE_REPACK", "0", 1);
  EXPECT_TRUE(off->InterleaveDenseFfn().ok());
  setenv("THERMOCLINE_REPACK", "maybe", 1);
  EXPECT_FALSE(off->InterleaveDenseFfn().ok());
  unsetenv("THERMOCLINE_REPACK");
  EXPECT_EQ(off->interleaved_bytes(), 0);
}

// With the attention and output copies of the load, and with the dense FFN's as well.
TEST_P(Interleaved8ModelTest, LogitsAndGreedyPicksMatchTheRowLayout) {
  for (bool ffn : {false, true}) {
    SCOPED_TRACE(ffn ? "attention, output and FFN interleaved" : "attention and output");
    CompareWithRowLayout(testing::ModelPath("quants/" + GetParam() + ".gguf"), ffn);
  }
}

void CompareWithRowLayout(const std::string& path, bool ffn) {
  const std::unique_ptr<Model> rows = LoadWithRepack(path, "0");
  const std::unique_ptr<Model> packed = LoadWithRepack(path, "1");
  ASSERT_TRUE(rows && packed);
  if (ffn) {
    ASSERT_TRUE(packed->InterleaveDenseFfn().ok());
  }
  ASSERT_GT(packed->interleaved_bytes(), 0);
  const std::string name = path.substr(path.rfind('/') + 1) + (ffn ? " +ffn" : "");
  const std::vector<int32_t> ids = PromptIds();
  ASSERT_EQ(ids.size(), 32u);
  const int64_t vocab = rows->config().vocab_size;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    auto kv_rows = KvCache::Create(rows->config(), 1, 64, GgmlType::kF32);
    auto kv_packed = KvCache::Create(packed->config(), 1, 64, GgmlType::kF32);
    ASSERT_TRUE(kv_rows.ok() && kv_packed.ok());
    ForwardPass pass_rows(*rows, *kv_rows, pool);
    ForwardPass pass_packed(*packed, *kv_packed, pool);
    std::vector<BatchEntry> batch;
    for (size_t p = 0; p < ids.size(); ++p) {
      batch.push_back({0, static_cast<int32_t>(p), ids[p], true});
    }
    std::vector<float> a, b;
    ASSERT_TRUE(pass_rows.Run(batch, a).ok());
    ASSERT_TRUE(pass_packed.Run(batch, b).ok());
    ASSERT_EQ(a.size(), b.size());
    const float row0 = MaxDiff(a.data(), b.data(), vocab);
    const float prompt = MaxDiff(a.data(), b.data(), static_cast<int64_t>(a.size()));
    EXPECT_LE(row0, kExactBound) << "threads " << threads;
    EXPECT_LE(prompt, kQ8ActivationBound) << "threads " << threads;
    std::vector<float> la(a.end() - vocab, a.end()), lb(b.end() - vocab, b.end());
    float steps = 0;
    int decided = 0, equal = 0;
    for (int s = 0; s < 16; ++s) {
      steps = std::max(steps, MaxDiff(la.data(), lb.data(), vocab));
      const int32_t pick = ArgMax(la.data(), vocab);
      const bool same = ArgMax(lb.data(), vocab) == pick;
      equal += same;
      if (Gap(la.data(), vocab) > 2 * kQ8ActivationBound) {
        EXPECT_TRUE(same) << "threads " << threads << " step " << s;
        ++decided;
      }
      const BatchEntry e{0, static_cast<int32_t>(32 + s), pick, true};
      ASSERT_TRUE(pass_rows.Run(std::span<const BatchEntry>(&e, 1), la).ok());
      ASSERT_TRUE(pass_packed.Run(std::span<const BatchEntry>(&e, 1), lb).ok());
    }
    EXPECT_LE(steps, kQ8ActivationBound) << "threads " << threads;
    std::printf("%s threads=%d: max|logit diff| row 0 %.3g, prompt %.3g, 16 steps %.3g; "
                "%d of 16 picks equal, %d decided\n",
                name.c_str(), threads, row0, prompt, steps, equal, decided);
  }
}

INSTANTIATE_TEST_SUITE_P(Files, Interleaved8ModelTest,
                         ::testing::Values("Q4_0", "pure-Q4_0", "Q4_K_M", "Q4_K_S", "Q5_K_M",
                                           "Q5_K_S", "IQ4_XS", "pure-IQ4_XS", "Q3_K_M",
                                           "pure-Q3_K"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(Interleaved8EnvironmentTest, RejectsAnUnknownValue) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  setenv("THERMOCLINE_REPACK", "yes", 1);
  auto model = Model::Load(testing::ModelPath("quants/Q4_0.gguf"));
  unsetenv("THERMOCLINE_REPACK");
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("THERMOCLINE_REPACK='yes' must be 0"), std::string::npos)
      << model.status();
}

}  // namespace
}  // namespace thermocline
