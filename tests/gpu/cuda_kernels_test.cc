// Each kernel of the CUDA backend (gpu_worker/cuda/kernels.h, and cuBLAS through GemmF16)
// against the host implementation the worker's host backend uses, on random inputs and random
// active sets. Every bound is stated where it is checked, with why it holds.
//
// Without a CUDA device every test skips with the reason (GTEST_SKIP), so ctest stays green on
// machines that build the backend but cannot run it (CI, development machines).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_worker/cuda/cuda_util.h"
#include "gpu_worker/cuda/kernels.h"
#include "shared/kernels/matmul.h"
#include "shared/gguf/quant.h"
#include "shared/runtime/kv_cache.h"
#include "shared/runtime/ops.h"
#include "shared/sparsity/neuron_ffn.h"
#include "shared/util/fp16.h"
#include "shared/util/thread_pool.h"

namespace thermocline::gpu_worker::cuda {
namespace {

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status s = CudaDeviceAvailable();
    if (!s.ok()) GTEST_SKIP() << "no CUDA device: " << s.message();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  void Sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

  template <typename T>
  CudaArray<T> Up(const std::vector<T>& v) {
    CudaArray<T> d;
    EXPECT_TRUE(d.Allocate(std::max<size_t>(v.size(), 1)).ok());
    if (!v.empty()) {
      EXPECT_TRUE(d.Upload(v.data(), v.size()).ok());
    }
    return d;
  }
  template <typename T>
  std::vector<T> Down(const CudaArray<T>& d, size_t n) {
    std::vector<T> v(n);
    EXPECT_TRUE(d.Download(v.data(), n).ok());
    return v;
  }

  std::vector<float> Random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }

  // The hot FFN over a's inputs into fresh coefficient, output and (zeroed) count buffers:
  // y [a.rows][a.dim] and the two counts back on the host.
  void RunHotFfn(HotFfnArgs a, std::vector<float>& y_out, std::vector<uint32_t>& stats_out) {
    CudaArray<float> coeff, y;
    CudaArray<uint32_t> stats;
    ASSERT_TRUE(coeff.Allocate(a.rows * a.max_count).ok());
    ASSERT_TRUE(y.Allocate(a.rows * a.dim).ok());
    ASSERT_TRUE(stats.Allocate(2).ok());
    ASSERT_EQ(cudaMemset(stats.get(), 0, stats.bytes()), cudaSuccess);
    a.coeff = coeff.get();
    a.stats = stats.get();
    a.y = y.get();
    ASSERT_EQ(LaunchHotFfn(a, stream_), cudaSuccess);
    Sync();
    y_out = Down(y, a.rows * a.dim);
    stats_out = Down(stats, 2);
  }

  std::mt19937 rng_{1234};
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaKernelsTest, RmsNormMatchesHost) {
  const int64_t rows = 3, n = 320;
  const std::vector<float> x = Random(rows * n, 2.0f), w = Random(n);
  const std::vector<int32_t> map = {2, 0};
  auto dx = Up(x), dw = Up(w);
  auto dmap = Up(map);
  CudaArray<float> out;
  CudaArray<uint16_t> half;
  ASSERT_TRUE(out.Allocate(rows * n).ok());
  ASSERT_TRUE(half.Allocate(rows * n).ok());
  ASSERT_EQ(LaunchRmsNorm(dx.get(), dw.get(), nullptr, rows, n, 1e-5f, out.get(), half.get(), stream_), cudaSuccess);
  Sync();
  std::vector<float> got = Down(out, rows * n);
  std::vector<uint16_t> got_h = Down(half, rows * n);
  std::vector<float> want(n);
  for (int64_t r = 0; r < rows; ++r) {
    RmsNorm(x.data() + r * n, w.data(), n, 1e-5f, want.data());
    for (int64_t i = 0; i < n; ++i) {
      // Only the order of the n-term sum of squares differs: relative error <= n * 2^-24 of the
      // scale, 2e-5 for n = 320; 1e-4 leaves room for the rsqrt.
      EXPECT_NEAR(got[r * n + i], want[i], 1e-4f * (1.0f + std::fabs(want[i])));
      // fp16 of the same value: off by at most half an fp16 ulp (2^-11 relative) more.
      EXPECT_NEAR(Fp16ToFp32(got_h[r * n + i]), want[i], 1e-3f * (1.0f + std::fabs(want[i])));
    }
  }
  // A row map picks the rows to normalize (the output head's want_logits rows).
  ASSERT_EQ(LaunchRmsNorm(dx.get(), dw.get(), dmap.get(), 2, n, 1e-5f, out.get(), nullptr, stream_), cudaSuccess);
  Sync();
  got = Down(out, 2 * n);
  for (int64_t r = 0; r < 2; ++r) {
    RmsNorm(x.data() + map[r] * n, w.data(), n, 1e-5f, want.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[r * n + i], want[i], 1e-4f * (1.0f + std::fabs(want[i])));
  }
}

TEST_F(CudaKernelsTest, RopeMatchesHostWithPartialRotation) {
  const int64_t rows = 3, heads = 4, head_dim = 16, rope_dim = 8, stride = heads * head_dim + 8;
  const std::vector<int32_t> pos = {0, 37, 1000};
  const std::vector<float> x = Random(rows * stride);
  auto dx = Up(x);
  auto dpos = Up(pos);
  ASSERT_EQ(LaunchRope(dx.get(), rows, stride, heads, head_dim, rope_dim, dpos.get(), 10000.0f, stream_), cudaSuccess);
  Sync();
  const std::vector<float> got = Down(dx, x.size());
  std::vector<float> want = x;
  for (int64_t r = 0; r < rows; ++r) Rope(want.data() + r * stride, heads, head_dim, rope_dim, pos[r], 10000.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    // powf may differ from std::pow by an ulp, which moves the angle pos * freq by up to
    // 1000 * 2^-23 rad; cosf/sinf add 2 ulp. 2e-4 of the pair's size covers both; the dims past
    // rope_dim and the padding of each row are untouched (checked exactly by the same bound).
    EXPECT_NEAR(got[i], want[i], 2e-4f * (1.0f + std::fabs(want[i]))) << i;
  }
}

TEST_F(CudaKernelsTest, RopeExtMatchesHostNeoxScaledWithFreqFactors) {
  // NeoX pairs, linear scaling, YaRN's ramp and Llama 3's frequency factors together: every
  // branch of ops.cc's RopeExt at once, on a partial rotation.
  const int64_t rows = 3, heads = 4, head_dim = 24, rope_dim = 16, stride = heads * head_dim + 4;
  const std::vector<int32_t> pos = {0, 37, 1000};
  const std::vector<float> x = Random(rows * stride);
  std::vector<float> factors(rope_dim / 2);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + 0.5f * static_cast<float>(i);
  auto dx = Up(x);
  auto dpos = Up(pos);
  auto dfac = Up(factors);
  RopeParams host;
  host.head_dim = head_dim;
  host.rope_dim = rope_dim;
  host.base = 500000.0f;
  host.neox = true;
  host.freq_factors = factors.data();
  host.freq_scale = 0.25f;
  host.ext_factor = 1.0f;
  host.attn_factor = 1.0f;
  RopeYarnCorrDims(rope_dim, 4096, host.base, 32.0f, 1.0f, &host.corr_low, &host.corr_high);
  RopeDesc dev;
  dev.head_dim = head_dim;
  dev.rope_dim = rope_dim;
  dev.base = host.base;
  dev.neox = true;
  dev.freq_factors = dfac.get();
  dev.freq_scale = host.freq_scale;
  dev.ext_factor = host.ext_factor;
  dev.attn_factor = host.attn_factor;
  dev.corr_low = host.corr_low;
  dev.corr_high = host.corr_high;
  ASSERT_EQ(LaunchRopeExt(dx.get(), rows, stride, heads, dev, dpos.get(), stream_), cudaSuccess);
  Sync();
  const std::vector<float> got = Down(dx, x.size());
  std::vector<float> want = x;
  for (int64_t r = 0; r < rows; ++r) RopeExt(want.data() + r * stride, heads, host, pos[r]);
  for (size_t i = 0; i < x.size(); ++i) {
    // As the plain rope's bound: an ulp of powf/logf moves the angle by <= 1000 * 2^-23 rad,
    // cosf/sinf add 2 ulp; YaRN's mscale (~1.14 here) scales the values, not the bound's form.
    EXPECT_NEAR(got[i], want[i], 2e-4f * (1.0f + std::fabs(want[i]))) << i;
  }
}

TEST_F(CudaKernelsTest, LayerNormMatchesHostWithBiasRowMapAndInPlace) {
  const int64_t rows = 3, n = 320;
  std::vector<float> x = Random(rows * n, 2.0f);
  for (float& v : x) v += 3.0f;  // a mean far from 0: the centring matters
  const std::vector<float> w = Random(n), b = Random(n);
  const std::vector<int32_t> map = {2, 0};
  auto dx = Up(x), dw = Up(w), db = Up(b);
  auto dmap = Up(map);
  CudaArray<float> out;
  CudaArray<uint16_t> half;
  ASSERT_TRUE(out.Allocate(rows * n).ok());
  ASSERT_TRUE(half.Allocate(rows * n).ok());
  ASSERT_EQ(LaunchLayerNorm(dx.get(), dw.get(), db.get(), nullptr, rows, n, 1e-5f, out.get(), half.get(), stream_), cudaSuccess);
  Sync();
  std::vector<float> got = Down(out, rows * n);
  const std::vector<uint16_t> got_h = Down(half, rows * n);
  std::vector<float> want(n);
  for (int64_t r = 0; r < rows; ++r) {
    LayerNorm(x.data() + r * n, w.data(), b.data(), n, 1e-5f, want.data());
    for (int64_t i = 0; i < n; ++i) {
      // Two n-term sums (mean, variance) in another order: relative n * 2^-24 each, and the
      // mean's error enters every centred value; 2e-4 of the scale covers it (as RmsNorm's).
      EXPECT_NEAR(got[r * n + i], want[i], 2e-4f * (1.0f + std::fabs(want[i])));
      EXPECT_NEAR(Fp16ToFp32(got_h[r * n + i]), want[i], 1e-3f * (1.0f + std::fabs(want[i])));
    }
  }
  // Without a bias, through a row map (the output head), and in place (out == x).
  ASSERT_EQ(LaunchLayerNorm(dx.get(), dw.get(), nullptr, dmap.get(), 2, n, 1e-5f, out.get(), nullptr, stream_), cudaSuccess);
  ASSERT_EQ(LaunchLayerNorm(dx.get(), dw.get(), nullptr, nullptr, rows, n, 1e-5f, dx.get(), nullptr, stream_), cudaSuccess);
  Sync();
  got = Down(out, 2 * n);
  const std::vector<float> inplace = Down(dx, rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    LayerNorm(x.data() + r * n, w.data(), nullptr, n, 1e-5f, want.data());
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(inplace[r * n + i], want[i], 2e-4f * (1.0f + std::fabs(want[i])));
    }
  }
  for (int64_t r = 0; r < 2; ++r) {
    LayerNorm(x.data() + map[r] * n, w.data(), nullptr, n, 1e-5f, want.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[r * n + i], want[i], 2e-4f * (1.0f + std::fabs(want[i])));
  }
}

TEST_F(CudaKernelsTest, PerHeadRmsNormInPlaceMatchesHost) {
  // The q/k norms of qwen3/gemma3: every head_dim span of a row is its own RMSNorm row.
  const int64_t rows = 3, heads = 5, head_dim = 64;
  const std::vector<float> x = Random(rows * heads * head_dim, 2.0f), w = Random(head_dim);
  auto dx = Up(x), dw = Up(w);
  ASSERT_EQ(LaunchRmsNorm(dx.get(), dw.get(), nullptr, rows * heads, head_dim, 1e-6f, dx.get(), nullptr, stream_), cudaSuccess);
  Sync();
  const std::vector<float> got = Down(dx, x.size());
  std::vector<float> want(head_dim);
  for (int64_t s = 0; s < rows * heads; ++s) {
    RmsNorm(x.data() + s * head_dim, w.data(), head_dim, 1e-6f, want.data());
    for (int64_t i = 0; i < head_dim; ++i) {
      EXPECT_NEAR(got[s * head_dim + i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << s;
    }
  }
}

TEST_F(CudaKernelsTest, AddBiasAddsOneVectorToEveryRow) {
  const int64_t rows = 7, n = 333;
  const std::vector<float> y = Random(rows * n), b = Random(n);
  auto dy = Up(y), db = Up(b);
  ASSERT_EQ(LaunchAddBias(dy.get(), db.get(), rows, n, stream_), cudaSuccess);
  Sync();
  const std::vector<float> got = Down(dy, y.size());
  // Exact: one float addition, as the host's AddRowBias.
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[r * n + i], y[r * n + i] + b[i]);
  }
}

// The KV store writes what the host cache's Store writes (bit for bit, f32 and fp16: both round
// to nearest even), and attention over it matches ForwardPass's per-head attention.
// window > 0: sliding-window layers; softcap > 0: gemma2's score cap; scale 0: 1/sqrt(head_dim).
void CheckAttention(bool f16, std::mt19937& rng, cudaStream_t stream, int64_t window = 0,
                    float softcap = 0.0f, float scale = 0.0f);

TEST_F(CudaKernelsTest, KvStoreAndAttentionMatchHostF32) { CheckAttention(false, rng_, stream_); }
TEST_F(CudaKernelsTest, KvStoreAndAttentionMatchHostF16) { CheckAttention(true, rng_, stream_); }
// A window shorter than some rows' positions (and longer than others'), a soft cap small enough
// to bend the scores, and a scale other than 1/sqrt(head_dim) (gemma's query_pre_attn_scalar).
TEST_F(CudaKernelsTest, AttentionWithWindowSoftCapAndScaleMatchesHost) {
  CheckAttention(false, rng_, stream_, /*window=*/7, /*softcap=*/2.0f, /*scale=*/0.11f);
  CheckAttention(true, rng_, stream_, /*window=*/7, /*softcap=*/2.0f, /*scale=*/0.11f);
}

void CheckAttention(bool f16, std::mt19937& rng, cudaStream_t stream, int64_t window,
                    float softcap, float scale) {
  ModelConfig c;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 2;  // GQA: 4 query heads per kv head
  c.head_dim = 32;
  c.dim = c.n_heads * c.head_dim;
  c.kv_dim = c.n_kv_heads * c.head_dim;
  c.context_length = 40;
  const int64_t slots = 3, cap = 40, layer = 1;
  auto host = KvCache::Create(c, slots, cap, f16 ? GgmlType::kF16 : GgmlType::kF32);
  ASSERT_TRUE(host.ok());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // Fill positions [0, len) of each slot through one store call per slot, as a prefill would.
  const std::vector<int64_t> len = {33, 1, 17};
  KvDesc kv;
  kv.f16 = f16;
  kv.n_slots = slots;
  kv.capacity = cap;
  kv.kv_dim = c.kv_dim;
  CudaArray<uint8_t> dk, dv;
  ASSERT_TRUE(dk.Allocate(host->bytes() / 2).ok());
  ASSERT_TRUE(dv.Allocate(host->bytes() / 2).ok());
  ASSERT_EQ(cudaMemset(dk.get(), 0, dk.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(dv.get(), 0, dv.bytes()), cudaSuccess);
  kv.k = dk.get();
  kv.v = dv.get();
  for (int64_t s = 0; s < slots; ++s) {
    std::vector<float> k(len[s] * c.kv_dim), v(len[s] * c.kv_dim);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    std::vector<int32_t> sl(len[s], static_cast<int32_t>(s)), pos(len[s]);
    for (int64_t p = 0; p < len[s]; ++p) {
      pos[p] = static_cast<int32_t>(p);
      host->Store(layer, s, p, k.data() + p * c.kv_dim, v.data() + p * c.kv_dim);
    }
    CudaArray<float> dkk, dvv;
    CudaArray<int32_t> dsl, dpos;
    ASSERT_TRUE(dkk.Allocate(k.size()).ok() && dkk.Upload(k.data(), k.size()).ok());
    ASSERT_TRUE(dvv.Allocate(v.size()).ok() && dvv.Upload(v.data(), v.size()).ok());
    ASSERT_TRUE(dsl.Allocate(sl.size()).ok() && dsl.Upload(sl.data(), sl.size()).ok());
    ASSERT_TRUE(dpos.Allocate(pos.size()).ok() && dpos.Upload(pos.data(), pos.size()).ok());
    ASSERT_EQ(LaunchKvStore(kv, layer, dkk.get(), dvv.get(), dsl.get(), dpos.get(), len[s], stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  std::vector<uint8_t> got_k(dk.bytes()), got_v(dv.bytes());
  ASSERT_TRUE(dk.Download(got_k.data(), got_k.size()).ok());
  ASSERT_TRUE(dv.Download(got_v.data(), got_v.size()).ok());
  EXPECT_EQ(std::memcmp(got_k.data(), host->key(0, 0, 0), got_k.size()), 0) << "keys differ";
  EXPECT_EQ(std::memcmp(got_v.data(), host->value(0, 0, 0), got_v.size()), 0) << "values differ";

  // Queries: rows attend at the last stored position of their slot (decode) and one in the
  // middle (a prompt row that sees only earlier positions).
  const std::vector<int32_t> rslot = {0, 1, 2, 0}, rpos = {32, 0, 16, 5};
  const int64_t rows = 4;
  std::vector<float> q(rows * c.dim);
  for (float& x : q) x = dist(rng);
  CudaArray<float> dq, scores, out;
  CudaArray<int32_t> ds, dp;
  ASSERT_TRUE(dq.Allocate(q.size()).ok() && dq.Upload(q.data(), q.size()).ok());
  ASSERT_TRUE(ds.Allocate(rows).ok() && ds.Upload(rslot.data(), rows).ok());
  ASSERT_TRUE(dp.Allocate(rows).ok() && dp.Upload(rpos.data(), rows).ok());
  ASSERT_TRUE(scores.Allocate(rows * c.n_heads * cap).ok());
  ASSERT_TRUE(out.Allocate(rows * c.dim).ok());
  AttentionDesc att;
  att.n_heads = c.n_heads;
  att.n_kv_heads = c.n_kv_heads;
  att.head_dim = c.head_dim;
  att.scale = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  att.softcap = softcap;
  att.window = window;
  ASSERT_EQ(LaunchAttention(kv, layer, dq.get(), ds.get(), dp.get(), rows, att, scores.get(),
                            out.get(), stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> got(rows * c.dim);
  ASSERT_TRUE(out.Download(got.data(), got.size()).ok());
  // Reference: ForwardPass's AttendHead (shared/runtime/forward.cc) on the host cache.
  auto load = [&](const uint8_t* p, int64_t i) {
    return f16 ? Fp16ToFp32(reinterpret_cast<const uint16_t*>(p)[i]) : reinterpret_cast<const float*>(p)[i];
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t off = (h / (c.n_heads / c.n_kv_heads)) * c.head_dim;
      const int64_t n_pos = rpos[r] + 1;
      const int64_t first = window > 0 ? std::max<int64_t>(0, n_pos - window) : 0;
      std::vector<float> s(n_pos - first);
      const float* qh = q.data() + r * c.dim + h * c.head_dim;
      for (int64_t t = first; t < n_pos; ++t) {
        float d = 0;
        const uint8_t* k = host->key(layer, rslot[r], t) + off * (f16 ? 2 : 4);
        for (int64_t i = 0; i < c.head_dim; ++i) d += qh[i] * load(k, i);
        s[t - first] = d * att.scale;
      }
      if (softcap > 0.0f) SoftCap(s.data(), n_pos - first, softcap);
      Softmax(s.data(), n_pos - first);
      for (int64_t i = 0; i < c.head_dim; ++i) {
        float want = 0;
        for (int64_t t = first; t < n_pos; ++t) {
          want += s[t - first] * load(host->value(layer, rslot[r], t) + off * (f16 ? 2 : 4), i);
        }
        // Sums of <= 40 terms of unit size in another order, and expf vs std::exp (2 ulp):
        // 1e-5 absolute on outputs of size ~1 is ~100 ulp of margin.
        EXPECT_NEAR(got[r * c.dim + h * c.head_dim + i], want, 1e-5f * (1.0f + std::fabs(want)))
            << "row " << r << " head " << h << " dim " << i;
      }
    }
  }
}

TEST_F(CudaKernelsTest, PredictSelectAndPackMatchHostThresholding) {
  const int64_t rows = 5, ffn = 3000;  // not a multiple of the 1024-thread chunk
  const float threshold = 0.3f;
  const std::vector<float> scores = Random(rows * ffn);
  // A random hot set of ~40%, compact indices in id order (the partition's layout).
  std::vector<int32_t> slot(ffn, -1);
  std::bernoulli_distribution hot(0.4);
  int32_t n_hot = 0;
  for (int64_t i = 0; i < ffn; ++i) {
    if (hot(rng_)) slot[i] = n_hot++;
  }
  auto ds = Up(scores);
  auto dslot = Up(slot);
  CudaArray<int32_t> hot_idx, hot_count, cold_ids, cold_count, packed;
  CudaArray<uint32_t> row_end;
  for (auto* a : {&hot_idx, &cold_ids, &packed}) ASSERT_TRUE(a->Allocate(rows * ffn).ok());
  ASSERT_TRUE(hot_count.Allocate(rows).ok());
  ASSERT_TRUE(cold_count.Allocate(rows).ok());
  ASSERT_TRUE(row_end.Allocate(rows).ok());
  ASSERT_EQ(LaunchPredictSelect(ds.get(), rows, ffn, threshold, dslot.get(), hot_idx.get(),
                                hot_count.get(), cold_ids.get(), cold_count.get(), stream_), cudaSuccess);
  ASSERT_EQ(LaunchPackCold(cold_ids.get(), cold_count.get(), rows, ffn, packed.get(), row_end.get(), stream_), cudaSuccess);
  Sync();
  const auto hi = Down(hot_idx, rows * ffn), hc = Down(hot_count, rows), pk = Down(packed, rows * ffn);
  const auto re = Down(row_end, rows);
  // Exact: the same comparisons as PredictorSet::Predict, split as SplitIds splits.
  std::vector<int32_t> all_cold;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> want_hot, want_cold;
    for (int64_t i = 0; i < ffn; ++i) {
      if (scores[r * ffn + i] < threshold) continue;
      if (slot[i] >= 0) {
        want_hot.push_back(slot[i]);
      } else {
        want_cold.push_back(static_cast<int32_t>(i));
      }
    }
    ASSERT_EQ(hc[r], static_cast<int32_t>(want_hot.size()));
    EXPECT_TRUE(std::equal(want_hot.begin(), want_hot.end(), hi.begin() + r * ffn)) << "row " << r;
    all_cold.insert(all_cold.end(), want_cold.begin(), want_cold.end());
    EXPECT_EQ(re[r], all_cold.size()) << "row_end of row " << r;
  }
  EXPECT_TRUE(std::equal(all_cold.begin(), all_cold.end(), pk.begin())) << "packed cold ids";
}

TEST_F(CudaKernelsTest, GemmF16MatchesHostMatMul) {
  const int64_t rows = 96, cols = 256, n = 5;
  const std::vector<float> wf = Random(rows * cols), x = Random(n * cols);
  std::vector<uint16_t> w(rows * cols), xh(n * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = Fp32ToFp16(wf[i]);
  for (size_t i = 0; i < xh.size(); ++i) xh[i] = Fp32ToFp16(x[i]);
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  auto dw = Up(w), dx = Up(xh);
  const std::vector<float> y0 = Random(n * rows);
  auto dy = Up(y0);
  // beta = 1: the output is added to (the backend's residual add into x).
  ASSERT_TRUE(GemmF16(blas, dw.get(), rows, cols, dx.get(), n, dy.get(), rows, 1.0f).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cublasDestroy(blas);
  const std::vector<float> got = Down(dy, n * rows);
  MatrixView m{GgmlType::kF16, rows, cols, reinterpret_cast<const uint8_t*>(w.data()), cols * 2};
  std::vector<float> want(n * rows);
  ThreadPool pool(1);
  MatMul(m, x.data(), n, cols, want.data(), rows, pool);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double mag = 0;
      for (int64_t c = 0; c < cols; ++c) mag += std::fabs(wf[r * cols + c] * x[t * cols + c]);
      // The device rounds x to fp16 (the host keeps it f32): each product moves by at most 2^-11
      // of its size, so the dot by 2^-11 * sum |w x|; fp32 accumulation in another order adds
      // cols * 2^-24 of the same sum. 1e-3 * sum |w x| covers both with 2x margin.
      EXPECT_NEAR(got[t * rows + r], y0[t * rows + r] + want[t * rows + r], 1e-3 * mag + 1e-5);
    }
  }
}

TEST_F(CudaKernelsTest, MergeAddsBothPartials) {
  const int64_t n = 1000;
  const std::vector<float> x = Random(n), yh = Random(n), yc = Random(n);
  auto dx = Up(x), dh = Up(yh), dc = Up(yc);
  ASSERT_EQ(LaunchMerge(dx.get(), dh.get(), dc.get(), n, stream_), cudaSuccess);
  Sync();
  std::vector<float> got = Down(dx, n);
  // Exact: the same two float additions as the host (out = y_hot + y_cold; x += out).
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], x[i] + (yh[i] + yc[i]));
  ASSERT_EQ(LaunchMerge(dx.get(), dh.get(), nullptr, n, stream_), cudaSuccess);
  Sync();
  const std::vector<float> got2 = Down(dx, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got2[i], got[i] + yh[i]);
}

// ---- dense matrices kept in their blocks (the attention projections and the output head) ----

struct BlockCase {
  GgmlType type;
  WeightFormat format;
};

class BlockMatrixTest : public CudaKernelsTest, public ::testing::WithParamInterface<BlockCase> {};

TEST_P(BlockMatrixTest, GemvAndHalfCopyMatchTheDequantizedRows) {
  const BlockCase& bc = GetParam();
  const int64_t rows = 70, cols = 512, n = 3;
  const int64_t row_bytes = RowBytes(bc.type, cols);
  std::vector<uint8_t> w(rows * row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> v = Random(cols, 0.1f);
    QuantizeRow(bc.type, v.data(), w.data() + r * row_bytes, cols);
  }
  std::vector<float> deq(rows * cols);
  for (int64_t r = 0; r < rows; ++r) DequantizeRow(bc.type, w.data() + r * row_bytes, deq.data() + r * cols, cols);
  const std::vector<float> x = Random(n * cols);
  auto dw = Up(w);
  auto dx = Up(x);
  CudaArray<float> y;
  CudaArray<uint16_t> half;
  ASSERT_TRUE(y.Allocate(n * rows).ok());
  ASSERT_TRUE(half.Allocate(rows * cols).ok());
  ASSERT_EQ(LaunchBlockGemv(bc.format, dw.get(), row_bytes, rows, cols, dx.get(), n, y.get(), rows, stream_), cudaSuccess);
  ASSERT_EQ(LaunchBlockToHalf(bc.format, dw.get(), row_bytes, rows, cols, half.get(), stream_), cudaSuccess);
  Sync();
  const std::vector<float> got = Down(y, n * rows);
  const std::vector<uint16_t> got_h = Down(half, rows * cols);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0, mag = 0;
      for (int64_t c = 0; c < cols; ++c) {
        exact += static_cast<double>(deq[r * cols + c]) * x[t * cols + c];
        mag += std::fabs(static_cast<double>(deq[r * cols + c]) * x[t * cols + c]);
      }
      // fp32 products of the decoded weights (the device may fuse a decoder's multiply-add:
      // one rounding less, 2^-24 of each weight) summed in another order: cols * 2^-24 of
      // sum |w x| at most, 3e-5 for 512 columns; 1e-4 leaves room.
      EXPECT_NEAR(got[t * rows + r], exact, 1e-4 * mag + 1e-6) << "token " << t << " row " << r;
    }
  }
  for (int64_t i = 0; i < rows * cols; ++i) {
    // The fp16 of the decoded value: within half an fp16 step (2^-11 relative) of it.
    EXPECT_NEAR(Fp16ToFp32(got_h[i]), deq[i], std::ldexp(std::fabs(deq[i]), -10) + 1e-7) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, BlockMatrixTest,
    ::testing::Values(BlockCase{GgmlType::kQ8_0, WeightFormat::kQ8_0},
                      BlockCase{GgmlType::kQ4_0, WeightFormat::kQ4_0},
                      BlockCase{GgmlType::kQ4_1, WeightFormat::kQ4_1},
                      BlockCase{GgmlType::kQ5_0, WeightFormat::kQ5_0},
                      BlockCase{GgmlType::kQ5_1, WeightFormat::kQ5_1},
                      BlockCase{GgmlType::kQ2_K, WeightFormat::kQ2_K},
                      BlockCase{GgmlType::kQ3_K, WeightFormat::kQ3_K},
                      BlockCase{GgmlType::kQ4_K, WeightFormat::kQ4_K},
                      BlockCase{GgmlType::kQ5_K, WeightFormat::kQ5_K},
                      BlockCase{GgmlType::kQ6_K, WeightFormat::kQ6_K},
                      BlockCase{GgmlType::kIQ4_NL, WeightFormat::kIQ4_NL},
                      BlockCase{GgmlType::kIQ4_XS, WeightFormat::kIQ4_XS}),
    [](const ::testing::TestParamInfo<BlockCase>& info) {
      return std::string(TypeTraits(info.param.type).name);
    });

// ---- the sparse hot FFN, per weight type ----

struct FfnCase {
  GgmlType type;
  WeightFormat kind;
  FfnActivation act;
  NeuronFilter filter;
  const char* name;
  bool gated = true;     // false: down(act(up h + up_b)) (falcon, starcoder2)
  bool up_bias = false;  // an up bias (starcoder2; gated FFNs with one too)
  // down rows of another type than gate and up (Q4_K_M: q6_K, q5_0 or q8_0); none: the same.
  std::optional<GgmlType> down_type;
  WeightFormat down_kind = WeightFormat::kF16;
};

// The backend's mapping (cuda_backend.cc asserts the numbers agree).
HotAct HotActOf(FfnActivation a) { return static_cast<HotAct>(static_cast<int>(a)); }

class HotFfnTest : public CudaKernelsTest, public ::testing::WithParamInterface<FfnCase> {};

TEST_P(HotFfnTest, MatchesNeuronFfn) {
  const FfnCase& fc = GetParam();
  const int64_t n_hot = 300, dim = 256, rows = 3;
  const GgmlType down_type = fc.down_type.value_or(fc.type);
  const WeightFormat down_kind = fc.down_type ? fc.down_kind : fc.kind;
  const int64_t row_bytes = RowBytes(fc.type, dim), down_row_bytes = RowBytes(down_type, dim);
  // Compact hot rows of gate, up and down_t, stored as the device stores them.
  std::vector<uint8_t> gate(n_hot * row_bytes), up(n_hot * row_bytes), down(n_hot * down_row_bytes);
  for (auto* m : {&gate, &up, &down}) {
    const GgmlType t = m == &down ? down_type : fc.type;
    const int64_t rb = m == &down ? down_row_bytes : row_bytes;
    for (int64_t r = 0; r < n_hot; ++r) {
      const std::vector<float> v = Random(dim, 0.1f);
      QuantizeRow(t, v.data(), m->data() + r * rb, dim);
    }
  }
  auto view = [&](const std::vector<uint8_t>& m) {
    return MatrixView{fc.type, n_hot, dim, m.data(), row_bytes};
  };
  const MatrixView down_view{down_type, n_hot, dim, down.data(), down_row_bytes};
  NeuronWeights w{fc.gated ? view(gate) : MatrixView{}, view(up), down_view, fc.act};
  const std::vector<float> up_b = fc.up_bias ? Random(n_hot, 0.3f) : std::vector<float>{};
  w.up_b = up_b;
  const std::vector<float> h = Random(rows * dim);
  // Random active sets: each row picks a random subset in random order (the predictor's pick
  // restricted to the hot neurons); row 1 is empty (a row may predict nothing hot).
  std::vector<int32_t> idx(rows * n_hot), counts(rows);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> all(n_hot);
    for (int64_t k = 0; k < n_hot; ++k) all[k] = static_cast<int32_t>(k);
    std::shuffle(all.begin(), all.end(), rng_);
    counts[r] = r == 1 ? 0 : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(1, n_hot)(rng_));
    std::copy(all.begin(), all.begin() + counts[r], idx.begin() + r * n_hot);
  }
  auto dg = Up(gate), du = Up(up), dd = Up(down);
  auto dub = Up(up_b);
  auto dh = Up(h);
  auto didx = Up(idx), dcnt = Up(counts);
  HotFfnArgs a;
  a.weights = fc.kind;
  a.down_weights = down_kind;
  a.gate = fc.gated ? dg.get() : nullptr;
  a.up = du.get();
  a.down = dd.get();
  a.up_b = fc.up_bias ? dub.get() : nullptr;
  a.row_bytes = row_bytes;
  a.down_row_bytes = down_row_bytes;
  a.dim = dim;
  a.act = HotActOf(fc.act);
  a.filter = fc.filter.kind == NeuronFilter::Kind::kNone ? 0 : fc.filter.kind == NeuronFilter::Kind::kPositive ? 1 : 2;
  a.cut = fc.filter.cut;
  a.coeff_cut = fc.filter.coeff_cut;
  a.idx = didx.get();
  a.idx_stride = n_hot;
  a.counts = dcnt.get();
  a.max_count = n_hot;
  a.h = dh.get();
  a.rows = rows;
  std::vector<float> got;
  std::vector<uint32_t> st;
  ASSERT_NO_FATAL_FAILURE(RunHotFfn(a, got, st));

  ThreadPool pool(1);
  NeuronFfn ffn(n_hot);
  const bool quantized = fc.type != GgmlType::kF16;
  uint64_t want_ran = 0, want_candidates = 0;
  std::vector<float> row(dim);
  for (int64_t r = 0; r < rows; ++r) {
    const float* hr = h.data() + r * dim;
    std::span<const int32_t> cand(idx.data() + r * n_hot, counts[r]);
    std::vector<float> want(dim, 0.0f);
    if (!cand.empty()) want_ran += ffn.Compute(w, hr, cand, fc.filter, want.data(), pool);
    want_candidates += cand.size();
    // An exact reference in double on fp32 h (the device's arithmetic, without rounding), and
    // the scale of the sum: sum_k |c_k| max_c |down_k[c]|.
    std::vector<double> exact(dim, 0.0);
    double scale = 1e-6;
    for (int32_t k : cand) {
      auto dot = [&](const std::vector<uint8_t>& m) {
        DequantizeRow(fc.type, m.data() + k * row_bytes, row.data(), dim);
        double s = 0;
        for (int64_t c = 0; c < dim; ++c) s += static_cast<double>(row[c]) * hr[c];
        return s;
      };
      const double bias = fc.up_bias ? up_b[k] : 0.0;
      const double g = fc.gated ? dot(gate) : dot(up) + bias;
      double act = g / (1 + std::exp(-g));
      if (fc.act == FfnActivation::kRelu || fc.act == FfnActivation::kDrelu) act = std::max(g, 0.0);
      // ops.h's GELU is ggml's fp16 table; the exact reference takes it on the float g.
      if (fc.act == FfnActivation::kGelu) act = Gelu(static_cast<float>(g));
      if (a.filter == 1 && !(act > 0)) continue;
      if (a.filter == 2 && !(std::fabs(act) >= fc.filter.cut)) continue;
      double cf = act;
      if (fc.gated) {
        const double u = dot(up) + bias;
        cf = fc.act == FfnActivation::kDrelu ? act * std::max(u, 0.0) : act * u;
      }
      if (a.coeff_cut > 0 && std::fabs(cf) < a.coeff_cut) continue;
      DequantizeRow(down_type, down.data() + k * down_row_bytes, row.data(), dim);
      double mx = 0;
      for (int64_t c = 0; c < dim; ++c) {
        exact[c] += cf * row[c];
        mx = std::max(mx, std::fabs(static_cast<double>(row[c])));
      }
      scale += std::fabs(cf) * mx;
    }
    for (int64_t c = 0; c < dim; ++c) {
      const float d = got[r * dim + c];
      // Against the exact sum: fp32 dot products of 256 terms and a sum of <= 300 rows in
      // another order, each within ~300 * 2^-24 of its scale: 1e-4 of the scale is 20x that.
      // GELU: the device rounds its own g to fp16 before the table's formula; an ulp of g can
      // move that rounding, and the output by one fp16 ulp (2^-11 relative): 1e-3 of the scale.
      const double tight = fc.act == FfnActivation::kGelu ? 1e-3 : 1e-4;
      EXPECT_NEAR(d, exact[c], tight * scale) << fc.name << " row " << r << " col " << c;
      // Against the host's NeuronFfn: F16 keeps h in f32 on both sides (1e-4 as above). For
      // Q8_0/Q4_0 the host quantizes h to Q8_0 blocks first (matmul.h): each h element moves by
      // at most half a step, amax/254, so gate and up each move by up to ~0.4% of sum |w h| and
      // their product by ~0.8%; 2e-2 of the scale bounds it with margin. (Filtered cases on
      // quantized weights could flip a borderline neuron between the two; the random sets and
      // cuts here stay clear of that, and the exact reference above is the tight check.)
      EXPECT_NEAR(d, want[c], (quantized ? 2e-2 : tight) * scale) << fc.name << " row " << r << " col " << c;
    }
  }
  EXPECT_EQ(st[1], want_candidates);
  if (!quantized) {
    EXPECT_EQ(st[0], want_ran);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, HotFfnTest,
    ::testing::Values(
        FfnCase{GgmlType::kF16, WeightFormat::kF16, FfnActivation::kRelu, NeuronFilter::None(), "f16_relu_none"},
        FfnCase{GgmlType::kF16, WeightFormat::kF16, FfnActivation::kRelu, NeuronFilter::Positive(), "f16_relu_positive"},
        FfnCase{GgmlType::kF16, WeightFormat::kF16, FfnActivation::kSilu, NeuronFilter::Magnitude(0.05f, 0.001f), "f16_silu_magnitude"},
        FfnCase{GgmlType::kQ8_0, WeightFormat::kQ8_0, FfnActivation::kRelu, NeuronFilter::None(), "q8_0_relu_none"},
        FfnCase{GgmlType::kQ8_0, WeightFormat::kQ8_0, FfnActivation::kRelu, NeuronFilter::Positive(), "q8_0_relu_positive"},
        FfnCase{GgmlType::kQ8_0, WeightFormat::kQ8_0, FfnActivation::kSilu, NeuronFilter::None(), "q8_0_silu_none"},
        FfnCase{GgmlType::kQ4_0, WeightFormat::kQ4_0, FfnActivation::kRelu, NeuronFilter::None(), "q4_0_relu_none"},
        FfnCase{GgmlType::kQ4_0, WeightFormat::kQ4_0, FfnActivation::kRelu, NeuronFilter::Positive(), "q4_0_relu_positive"},
        FfnCase{GgmlType::kQ4_0, WeightFormat::kQ4_0, FfnActivation::kSilu, NeuronFilter::None(), "q4_0_silu_none"},
        // The FFN forms of the other architectures: GELU-gated (gemma2), dReLU (bamboo), and
        // without a gate, with an up bias (falcon's ReLU MLP, starcoder2's GELU MLP).
        FfnCase{GgmlType::kF16, WeightFormat::kF16, FfnActivation::kGelu, NeuronFilter::None(), "f16_gelu_gated", true, true},
        FfnCase{GgmlType::kF16, WeightFormat::kF16, FfnActivation::kDrelu, NeuronFilter::Positive(), "f16_drelu_positive"},
        FfnCase{GgmlType::kF16, WeightFormat::kF16, FfnActivation::kRelu, NeuronFilter::Positive(), "f16_relu_plain_bias", false, true},
        FfnCase{GgmlType::kQ8_0, WeightFormat::kQ8_0, FfnActivation::kGelu, NeuronFilter::None(), "q8_0_gelu_plain_bias", false, true},
        // Every other block type read as stored (gpu_worker/cuda/block_decode.h), and Q4_K_M's
        // mix: q4_K gate and up with q6_K down rows.
        FfnCase{GgmlType::kQ4_1, WeightFormat::kQ4_1, FfnActivation::kRelu, NeuronFilter::None(), "q4_1_relu_none"},
        FfnCase{GgmlType::kQ5_0, WeightFormat::kQ5_0, FfnActivation::kSilu, NeuronFilter::None(), "q5_0_silu_none"},
        FfnCase{GgmlType::kQ5_1, WeightFormat::kQ5_1, FfnActivation::kRelu, NeuronFilter::Positive(), "q5_1_relu_positive"},
        FfnCase{GgmlType::kQ2_K, WeightFormat::kQ2_K, FfnActivation::kRelu, NeuronFilter::None(), "q2_K_relu_none"},
        FfnCase{GgmlType::kQ3_K, WeightFormat::kQ3_K, FfnActivation::kSilu, NeuronFilter::None(), "q3_K_silu_none"},
        FfnCase{GgmlType::kQ4_K, WeightFormat::kQ4_K, FfnActivation::kRelu, NeuronFilter::Positive(), "q4_K_relu_positive"},
        FfnCase{GgmlType::kQ5_K, WeightFormat::kQ5_K, FfnActivation::kSilu, NeuronFilter::None(), "q5_K_silu_none"},
        FfnCase{GgmlType::kQ6_K, WeightFormat::kQ6_K, FfnActivation::kRelu, NeuronFilter::None(), "q6_K_relu_none"},
        FfnCase{GgmlType::kIQ4_NL, WeightFormat::kIQ4_NL, FfnActivation::kSilu, NeuronFilter::None(), "iq4_nl_silu_none"},
        FfnCase{GgmlType::kIQ4_XS, WeightFormat::kIQ4_XS, FfnActivation::kRelu, NeuronFilter::None(), "iq4_xs_relu_none"},
        FfnCase{GgmlType::kQ4_K, WeightFormat::kQ4_K, FfnActivation::kRelu, NeuronFilter::None(), "q4_K_m_mix", true, false, GgmlType::kQ6_K, WeightFormat::kQ6_K}),
    [](const ::testing::TestParamInfo<FfnCase>& info) { return std::string(info.param.name); });


// Threshold MoE: each hot row filtered by its own expert's cuts (row_cut), the shared expert's
// rows by none (cut 0), every coefficient scaled by its candidate's router weight. The fallback
// cut of the arguments is far above every activation, so a kernel that ignored row_cut would
// drop nearly every neuron and fail the count and the sums.
TEST_F(CudaKernelsTest, HotFfnFiltersEachRowByItsOwnCutsAndScales) {
  const int64_t group = 32, n_hot = 3 * group, dim = 256, rows = 2;
  const float cuts[3][2] = {{0.3f, 0.2f}, {1.0f, 0.5f}, {0.0f, 0.0f}};  // expert 0, 1, shared
  const int64_t row_bytes = RowBytes(GgmlType::kF16, dim);
  std::vector<uint8_t> gate(n_hot * row_bytes), up(n_hot * row_bytes), down(n_hot * row_bytes);
  for (auto* m : {&gate, &up, &down}) {
    for (int64_t r = 0; r < n_hot; ++r) {
      const std::vector<float> v = Random(dim, 0.1f);
      QuantizeRow(GgmlType::kF16, v.data(), m->data() + r * row_bytes, dim);
    }
  }
  std::vector<float> row_cut(2 * n_hot);
  for (int64_t q = 0; q < n_hot; ++q) {
    row_cut[2 * q] = cuts[q / group][0];
    row_cut[2 * q + 1] = cuts[q / group][1];
  }
  const std::vector<float> h = Random(rows * dim);
  // Row 0: every hot row in a shuffled order; row 1: expert 1's and the shared rows.
  std::vector<int32_t> idx(rows * n_hot, 0), counts(rows);
  std::vector<float> scale(rows * n_hot, 0.0f);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int64_t k = 0; k < n_hot; ++k) idx[k] = static_cast<int32_t>(k);
  std::shuffle(idx.begin(), idx.begin() + n_hot, rng_);
  counts[0] = static_cast<int32_t>(n_hot);
  for (int64_t k = 0; k < 2 * group; ++k) idx[n_hot + k] = static_cast<int32_t>(group + k);
  counts[1] = static_cast<int32_t>(2 * group);
  for (float& w : scale) w = weight(rng_);

  auto dg = Up(gate), du = Up(up), dd = Up(down);
  auto dh = Up(h), dcut = Up(row_cut), dscale = Up(scale);
  auto didx = Up(idx), dcnt = Up(counts);
  HotFfnArgs a;
  a.gate = dg.get();
  a.up = du.get();
  a.down = dd.get();
  a.row_bytes = row_bytes;
  a.down_row_bytes = row_bytes;
  a.dim = dim;
  a.act = HotAct::kSilu;
  a.filter = 2;
  a.cut = 1e6f;
  a.coeff_cut = 1e6f;
  a.row_cut = dcut.get();
  a.idx = didx.get();
  a.idx_stride = n_hot;
  a.scale = dscale.get();
  a.counts = dcnt.get();
  a.max_count = n_hot;
  a.h = dh.get();
  a.rows = rows;
  std::vector<float> got;
  std::vector<uint32_t> st;
  ASSERT_NO_FATAL_FAILURE(RunHotFfn(a, got, st));

  uint32_t want_ran = 0;
  int dropped[3] = {0, 0, 0};
  std::vector<float> wrow(dim);
  for (int64_t r = 0; r < rows; ++r) {
    const float* hr = h.data() + r * dim;
    std::vector<double> want(dim, 0.0);
    double mag = 1e-6;
    for (int64_t k = 0; k < counts[r]; ++k) {
      const int32_t q = idx[r * n_hot + k];
      auto dot = [&](const std::vector<uint8_t>& m) {
        DequantizeRow(GgmlType::kF16, m.data() + q * row_bytes, wrow.data(), dim);
        double s = 0;
        for (int64_t c = 0; c < dim; ++c) s += static_cast<double>(wrow[c]) * hr[c];
        return s;
      };
      const double g = dot(gate);
      const double act = g / (1 + std::exp(-g));
      const double cf = act * dot(up);
      const bool act_passes = std::fabs(act) >= row_cut[2 * q];
      want_ran += act_passes;  // the kernel counts the gate's pass, before the coefficient cut
      if (!act_passes || (row_cut[2 * q + 1] > 0 && std::fabs(cf) < row_cut[2 * q + 1])) {
        ++dropped[q / group];
        continue;
      }
      const double c = cf * scale[r * n_hot + k];
      DequantizeRow(GgmlType::kF16, down.data() + q * row_bytes, wrow.data(), dim);
      for (int64_t i = 0; i < dim; ++i) {
        want[i] += c * wrow[i];
        mag += std::fabs(c * wrow[i]);
      }
    }
    // fp32 dot products and sums in another order: 1e-4 of the magnitude (as MatchesNeuronFfn).
    for (int64_t i = 0; i < dim; ++i) EXPECT_NEAR(got[r * dim + i], want[i], 1e-4 * mag) << r << " " << i;
  }
  // The cuts bite where they are set and nowhere else.
  EXPECT_GT(dropped[0], 0);
  EXPECT_GT(dropped[1], dropped[0]);
  EXPECT_EQ(dropped[2], 0);
  EXPECT_EQ(st[1], static_cast<uint32_t>(counts[0] + counts[1]));
  EXPECT_EQ(st[0], want_ran);
}

}  // namespace
}  // namespace thermocline::gpu_worker::cuda
