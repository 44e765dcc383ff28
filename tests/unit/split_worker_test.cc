// The pieces of the two workers in-process: the hot/cold partition, the compacted cold rows,
// the cold executor against NeuronFfn over the full weights, the CPU list parser, and the GPU
// side's split FFN (with the cold executor behind an in-process ColdLink) against the
// single-process SparseFfn / DenseFfn; the same for MoE layers split per expert.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cpu_worker/cold_executor.h"
#include "cpu_worker/cold_rows.h"
#include "cpu_worker/numa.h"
#include "gpu_worker/host/split_ffn.h"
#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/model/synth.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/teal.h"
#include "shared/util/memory_lock.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

std::unique_ptr<Model> Stories() {
  auto m = Model::Load(testing::ModelPath("stories260K/stories260K.gguf"));
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

// A small ReLU MoE model: 4 experts, 2 used per token (qwen2moe adds its shared expert).
std::unique_ptr<Model> SynthMoe(const std::string& arch) {
  SynthOptions o;
  o.arch = arch;
  o.dim = 64;
  o.ffn = 96;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 300;
  o.context = 32;
  o.experts = 4;
  o.ffn_kind = SynthFfnKind::kReluGated;
  o.active_fraction = 0;  // i.i.d. weights: about half the neurons fire
  o.seed = 13;
  const std::string path = testing::TempDir() + "/split_worker_moe_" + arch + ".gguf";
  const absl::Status written = WriteSynthModel(o, path);
  EXPECT_TRUE(written.ok()) << written;
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m.ok() && (*m)->config().moe());
  return m.ok() ? std::move(*m) : nullptr;
}

// A placement with a random half of every layer's neurons hot (every expert's, in MoE layers).
Placement RandomPlacement(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Placement p;
  p.layers.resize(c.n_layers);
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    LayerPlacement& l = p.layers[layer];
    const int32_t n = static_cast<int32_t>(LayerNeurons(c, layer));
    l.on_gpu.assign(n, 0);
    for (int32_t i = 0; i < n; ++i) {
      if (rng() % 2) {
        l.on_gpu[i] = 1;
        l.gpu_bucket.push_back(i);
      }
    }
  }
  return p;
}

TEST(SplitWorkerTest, PartitionIsDisjointAndCoversEveryNeuron) {
  auto model = Stories();
  const ModelConfig& c = model->config();
  for (double f : {0.0, 0.3, 1.0}) {
    auto part = Partition::FromPlacement(Placement::Uniform(c, f), c);
    ASSERT_TRUE(part.ok()) << part.status();
    for (const LayerPartition& l : part->layers) {
      std::vector<int32_t> all = l.hot;
      all.insert(all.end(), l.cold.begin(), l.cold.end());
      std::sort(all.begin(), all.end());
      std::vector<int32_t> expect(c.ffn_dim);
      std::iota(expect.begin(), expect.end(), 0);
      EXPECT_EQ(all, expect);  // union is everything, and no id twice
      EXPECT_EQ(static_cast<int64_t>(l.hot.size()), std::llround(f * c.ffn_dim));
      for (size_t k = 0; k < l.cold.size(); ++k) EXPECT_EQ(l.cold_index[l.cold[k]], int32_t(k));
      for (int32_t id : l.hot) EXPECT_EQ(l.cold_index[id], -1);
      std::vector<int32_t> hot, cold;
      SplitIds(l, expect, &hot, &cold);
      EXPECT_EQ(hot, l.hot);
      EXPECT_EQ(cold, l.cold);
    }
  }
  PlacementFlags none;
  EXPECT_FALSE(PlacementFromFlags(c, none).ok());
  PlacementFlags bad;
  bad.hot_fraction = 1.5;
  EXPECT_FALSE(PlacementFromFlags(c, bad).ok());
}

// The cold rows' layouts: three compact matrices, neuron bundles of [up | down] with the gate
// apart (exact, threshold, dense layers), bundles of [gate | up | down] (predicted layers).
struct ColdLayoutCase {
  const char* name;
  bool bundles;
  bool gate_in_bundle;
};

class ColdLayoutTest : public ::testing::TestWithParam<ColdLayoutCase> {
 protected:
  absl::StatusOr<cpu_worker::ColdRows> Build(const Model& model, const Partition& part,
                                             ThreadPool& pool) {
    const ModelConfig& c = model.config();
    plan_ = SparsityPlan::Uniform(
        GetParam().gate_in_bundle ? SparsityMode::kPredicted : SparsityMode::kExact, c.n_layers);
    return cpu_worker::ColdRows::Build(model, part, std::nullopt, pool, &plan_, GetParam().bundles);
  }
  SparsityPlan plan_;  // only its modes are read: which layers gather their gate by candidate
};

TEST_P(ColdLayoutTest, ColdRowsEqualTheModelsRows) {
  auto model = Stories();
  const ModelConfig& c = model->config();
  ThreadPool pool(1);
  auto part = Partition::FromPlacement(RandomPlacement(c, 7), c);
  ASSERT_TRUE(part.ok());
  auto rows = Build(*model, *part, pool);
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto down = DownRows::ForLayer(*model, l, std::nullopt, pool);
    ASSERT_TRUE(down.ok());
    const NeuronWeights& w = rows->layer(l);
    const std::vector<int32_t>& cold = part->layers[l].cold;
    ASSERT_EQ(w.gate.rows, static_cast<int64_t>(cold.size()));
    for (size_t k = 0; k < cold.size(); ++k) {
      const LayerWeights& lw = model->layer(l);
      EXPECT_EQ(std::memcmp(w.gate.row(k), lw.gate.row(cold[k]), lw.gate.row_bytes), 0);
      EXPECT_EQ(std::memcmp(w.up.row(k), lw.up.row(cold[k]), lw.up.row_bytes), 0);
      EXPECT_EQ(std::memcmp(w.down_t.row(k), down->view().row(cold[k]), w.down_t.row_data_bytes()), 0);
    }
    // The layout asked for: one neuron's rows one stride apart, or packed matrices.
    const int64_t packed = RowBytes(w.up.type, c.dim);
    EXPECT_EQ(w.up.row_bytes == packed, !GetParam().bundles) << "layer " << l;
    if (GetParam().bundles) {
      EXPECT_EQ(w.up.row_bytes, w.down_t.row_bytes) << "layer " << l;
      EXPECT_EQ(w.gate.row_bytes == w.up.row_bytes, GetParam().gate_in_bundle) << "layer " << l;
    }
  }
}

TEST_P(ColdLayoutTest, ColdExecutorEqualsNeuronFfnOverTheSameIds) {
  auto model = Stories();
  const ModelConfig& c = model->config();
  ThreadPool pool(1);
  auto part = Partition::FromPlacement(RandomPlacement(c, 11), c);
  ASSERT_TRUE(part.ok());
  auto rows = Build(*model, *part, pool);
  ASSERT_TRUE(rows.ok());
  const SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kDense, c.n_layers);
  cpu_worker::ColdExecutor exec(*rows, *part, plan, c.activation, pool);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const int64_t layer = 2;
  const LayerPartition& lp = part->layers[layer];
  auto down = DownRows::ForLayer(*model, layer, std::nullopt, pool);
  NeuronWeights full{model->layer(layer).gate, model->layer(layer).up, down->view(), c.activation};
  // Candidate sets: empty, one, all cold, and an unaligned random subset per row.
  std::vector<std::vector<int32_t>> sets = {{}, {lp.cold[5]}, lp.cold, {}};
  for (int32_t id : lp.cold) {
    if (rng() % 3 == 0) sets[3].push_back(id);
  }
  const uint32_t n_rows = static_cast<uint32_t>(sets.size());
  std::vector<float> h(n_rows * c.dim);
  for (float& x : h) x = normal(rng);
  ipc::ActivationView a;
  a.step_id = 1;
  a.layer = layer;
  a.rows = n_rows;
  a.dim = static_cast<uint32_t>(c.dim);
  a.h = absl::MakeConstSpan(h);
  for (const auto& s : sets) {
    a.active.insert(a.active.end(), s.begin(), s.end());
    a.row_end.push_back(static_cast<uint32_t>(a.active.size()));
  }
  std::vector<float> y(n_rows * c.dim);
  ASSERT_TRUE(exec.Compute(a, y).ok());
  NeuronFfn ref_ffn;
  for (uint32_t r = 0; r < n_rows; ++r) {
    std::vector<float> ref(c.dim, 0.0f);
    ref_ffn.Compute(full, h.data() + r * c.dim, sets[r], NeuronFilter::None(), ref.data(), pool);
    for (int64_t i = 0; i < c.dim; ++i) {
      EXPECT_EQ(y[r * c.dim + i], ref[i]) << "row " << r << " element " << i;
    }
  }
  // All-candidates equals the explicit list of every cold neuron.
  ipc::ActivationView all = a;
  all.all_candidates = true;
  all.rows = 1;
  all.h = absl::MakeConstSpan(h).subspan(2 * c.dim, c.dim);
  all.row_end.clear();
  all.active.clear();
  std::vector<float> y_all(c.dim);
  ASSERT_TRUE(exec.Compute(all, y_all).ok());
  EXPECT_EQ(y_all, std::vector<float>(y.begin() + 2 * c.dim, y.begin() + 3 * c.dim));
  // A hot id is refused, not computed.
  ipc::ActivationView hot = a;
  hot.rows = 1;
  hot.active = {lp.hot[0]};
  hot.row_end = {1};
  hot.h = absl::MakeConstSpan(h).subspan(0, c.dim);
  absl::Status s = exec.Compute(hot, std::span<float>(y.data(), c.dim));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is hot, not cold"), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ColdLayoutTest,
                         ::testing::Values(ColdLayoutCase{"separate", false, false},
                                           ColdLayoutCase{"up_down_bundles", true, false},
                                           ColdLayoutCase{"gate_up_down_bundles", true, true}),
                         [](const ::testing::TestParamInfo<ColdLayoutCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(SplitWorkerTest, ParseCpuList) {
  auto cpus = cpu_worker::ParseCpuList("0-3,6,2");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, (std::vector<int>{0, 1, 2, 3, 6}));
  for (const char* bad : {"", "a", "3-1", "-1", "0-", "1,,2"}) {
    EXPECT_FALSE(cpu_worker::ParseCpuList(bad).ok()) << bad;
  }
}

// The cold executor behind a ColdLink, in-process: what the CPU worker does with the rings.
class LoopbackLink final : public gpu_worker::ColdLink {
 public:
  explicit LoopbackLink(cpu_worker::ColdExecutor& exec) : exec_(exec) {}
  absl::Status SendCold(const gpu_worker::ColdRequest& r) override {
    h_.assign(r.h.begin(), r.h.end());
    view_ = ipc::ActivationView{};
    view_.layer = static_cast<uint32_t>(r.layer);
    view_.rows = static_cast<uint32_t>(r.rows);
    view_.dim = static_cast<uint32_t>(r.dim);
    view_.h = absl::MakeConstSpan(h_);
    view_.all_candidates = r.all_cold;
    view_.row_end.assign(r.row_end.begin(), r.row_end.end());
    view_.active.assign(r.ids.begin(), r.ids.end());
    view_.picks = static_cast<uint32_t>(r.picks);
    view_.experts.assign(r.experts.begin(), r.experts.end());
    view_.expert_weights.assign(r.expert_weights.begin(), r.expert_weights.end());
    view_.cuts.assign(r.cuts.begin(), r.cuts.end());
    ++sent_;
    return absl::OkStatus();
  }
  absl::Status ReceiveCold(int64_t, std::span<float> y) override { return exec_.Compute(view_, y); }
  int sent_ = 0;

 private:
  cpu_worker::ColdExecutor& exec_;
  std::vector<float> h_;
  ipc::ActivationView view_;
};

TEST(SplitWorkerTest, SplitFfnMatchesSingleProcessFfn) {
  auto model = Stories();
  const ModelConfig& c = model->config();
  ThreadPool pool(1);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t n = 3;
  std::vector<float> h(n * c.dim);
  for (float& x : h) x = normal(rng);
  DenseFfn dense(*model, pool);
  for (double f : {0.0, 0.5, 1.0}) {
    const SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kDense, c.n_layers);
    auto part = Partition::FromPlacement(Placement::Uniform(c, f), c);
    auto rows = cpu_worker::ColdRows::Build(*model, *part, std::nullopt, pool);
    cpu_worker::ColdExecutor exec(*rows, *part, plan, c.activation, pool);
    auto split = gpu_worker::SplitFfn::Create(*model, plan, *part, pool);
    ASSERT_TRUE(split.ok()) << split.status();
    LoopbackLink link(exec);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      std::vector<float> got(n * c.dim), want(n * c.dim);
      (*split)->BeginStep(&link);
      (*split)->Compute(l, h.data(), n, got.data());
      ASSERT_TRUE((*split)->EndStep().ok());
      dense.Compute(l, h.data(), n, want.data());
      for (int64_t i = 0; i < n * c.dim; ++i) {
        if (f == 1.0) {
          ASSERT_EQ(got[i], want[i]);  // DenseFfn itself
        } else {
          ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::fabs(want[i])));  // order of the sum
        }
      }
    }
    EXPECT_EQ(link.sent_, f == 1.0 ? 0 : c.n_layers);  // nothing crosses when all is hot
  }
}

// TEAL over the split FFN (--sparsity teal): a batch of a prompt row between two decode rows,
// against DenseFfn through TealLinear in one process. The decode rows carry their cuts to the
// cold side; the prompt row runs as without TEAL. Bit for bit with every neuron hot, else
// within the reassociation of the sums. stories260K (SwiGLU) and a plain GELU MLP with up and
// down biases (starcoder2). A CPU side without its TEAL copies refuses the cuts.
TEST(SplitWorkerTest, TealSplitFfnMatchesSingleProcessTeal) {
  SynthOptions so;
  so.arch = "starcoder2";
  so.dim = 64;
  so.ffn = 160;
  so.layers = 2;
  so.heads = 4;
  so.kv_heads = 4;
  so.vocab = 300;
  so.context = 32;
  so.threads = 1;
  const std::string biased_path = testing::TempDir() + "/split_worker_teal_starcoder2.gguf";
  ASSERT_TRUE(WriteSynthModel(so, biased_path).ok());
  auto biased = Model::Load(biased_path);
  ASSERT_TRUE(biased.ok()) << biased.status();
  ASSERT_FALSE((*biased)->layer(0).down_b.empty());
  auto stories = Stories();
  for (const Model* model : {stories.get(), biased->get()}) {
    const ModelConfig& c = model->config();
    SCOPED_TRACE(model == stories.get() ? "stories260K" : "starcoder2");
    ThreadPool pool(1);
    std::mt19937 rng(9);
    std::normal_distribution<float> normal;
    const int64_t n = 3;
    std::vector<float> h(n * c.dim);
    for (float& x : h) x = normal(rng);
    const uint8_t decode[n] = {1, 0, 1};
    TealPlan teal = TealPlan::TopShare(c.n_layers, 0.0f);
    teal.kind = TealPlan::Kind::kCuts;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      // Gate and up side by side in even layers, apart in odd ones.
      teal.values[l][static_cast<int>(Projection::kGate)] = 0.6f;
      teal.values[l][static_cast<int>(Projection::kUp)] = l % 2 == 0 ? 0.6f : 0.8f;
      teal.values[l][static_cast<int>(Projection::kDown)] = 0.01f;
    }
    auto linear = TealLinear::Create(*model, teal, pool);
    ASSERT_TRUE(linear.ok()) << linear.status();
    DenseFfn one(*model, pool);
    one.set_linear(linear->get());
    const SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kDense, c.n_layers);
    for (double f : {0.0, 0.5, 1.0}) {
      auto part = Partition::FromPlacement(Placement::Uniform(c, f), c);
      auto rows = cpu_worker::ColdRows::Build(*model, *part, std::nullopt, pool);
      cpu_worker::ColdExecutor exec(*rows, *part, plan, c.activation, pool);
      ASSERT_TRUE(exec.EnableTeal(teal).ok());
      auto split = gpu_worker::SplitFfn::Create(*model, plan, *part, pool, teal);
      ASSERT_TRUE(split.ok()) << split.status();
      LoopbackLink link(exec);
      for (int64_t l = 0; l < c.n_layers; ++l) {
        std::vector<float> got(n * c.dim), want(n * c.dim), plain(n * c.dim);
        (*split)->BeginStep(&link, decode);
        (*split)->Compute(l, h.data(), n, got.data());
        ASSERT_TRUE((*split)->EndStep().ok());
        (*linear)->BeginBatch(decode);
        one.Compute(l, h.data(), n, want.data());
        DenseFfn(*model, pool).Compute(l, h.data(), n, plain.data());
        double moved = 0;  // how far TEAL moves the decode rows: the test must see the cuts
        for (int64_t i = 0; i < n * c.dim; ++i) {
          moved = std::max(moved, static_cast<double>(std::fabs(want[i] - plain[i])));
          if (f == 1.0) {
            ASSERT_EQ(got[i], want[i]) << "layer " << l << " value " << i;
          } else {
            ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::fabs(want[i])))
                << "hot " << f << " layer " << l << " value " << i;
          }
        }
        EXPECT_GT(moved, 1e-3) << "layer " << l;
        // The prompt row is the dense FFN's.
        for (int64_t i = c.dim; i < 2 * c.dim; ++i) {
          ASSERT_NEAR(got[i], plain[i], 1e-5f * (1 + std::fabs(plain[i])));
        }
      }
      EXPECT_EQ(link.sent_, f == 1.0 ? 0 : c.n_layers);
    }
  }
  auto model = std::move(stories);
  const ModelConfig& c = model->config();
  ThreadPool pool(1);
  const SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kDense, c.n_layers);
  std::vector<float> h(c.dim, 0.5f);
  // A cold side that was not given the TEAL plan refuses cuts, naming the flag.
  auto part = Partition::FromPlacement(Placement::Uniform(c, 0.5), c);
  auto rows = cpu_worker::ColdRows::Build(*model, *part, std::nullopt, pool);
  cpu_worker::ColdExecutor plain_exec(*rows, *part, plan, c.activation, pool);
  ipc::ActivationView a;
  a.layer = 0;
  a.rows = 1;
  a.dim = static_cast<uint32_t>(c.dim);
  a.h = absl::MakeConstSpan(h).first(c.dim);
  a.all_candidates = true;
  a.cuts = {0.5f, 0.5f, 0.1f};
  std::vector<float> y(c.dim);
  absl::Status s = plain_exec.Compute(a, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("carries TEAL cuts"), std::string::npos) << s;
  // A plan of per-token shares cannot be split (down's cut needs every neuron).
  EXPECT_EQ(plain_exec.EnableTeal(TealPlan::TopShare(c.n_layers, 0.5f)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      gpu_worker::SplitFfn::Create(*model, plan, *part, pool, TealPlan::TopShare(c.n_layers, 0.5f))
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// The cpu worker's --mlock locks TEAL's copies of its neurons as well as the cold rows: both are
// what a token reads, and a page of either swapped out stalls the token.
TEST(SplitWorkerTest, MlockLocksColdRowsAndTealCopies) {
  auto model = Stories();
  const ModelConfig& c = model->config();
  ThreadPool pool(1);
  TealPlan teal = TealPlan::TopShare(c.n_layers, 0.0f);
  teal.kind = TealPlan::Kind::kCuts;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    teal.values[l][static_cast<int>(Projection::kGate)] = 0.5f;
    teal.values[l][static_cast<int>(Projection::kUp)] = 0.5f;
  }
  auto part = Partition::FromPlacement(Placement::Uniform(c, 0.0), c);
  ASSERT_TRUE(part.ok()) << part.status();
  auto rows = cpu_worker::ColdRows::Build(*model, *part, std::nullopt, pool);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kDense, c.n_layers);
  cpu_worker::ColdExecutor exec(*rows, *part, plan, c.activation, pool);
  ASSERT_TRUE(exec.EnableTeal(teal).ok());
  ASSERT_GT(exec.teal_bytes(), 0);

  auto before = LockedBytes();
  ASSERT_TRUE(before.ok()) << before.status();
  if (geteuid() != 0) {
    // Without the privilege to exceed it, a limit at what is locked now refuses more, and the
    // error says what and how to raise it. (Root locks past any limit.)
    rlimit saved{};
    ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &saved), 0);
    rlimit tight = saved;
    tight.rlim_cur = static_cast<rlim_t>(*before);
    ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &tight), 0);
    absl::Status refused = exec.LockTeal();
    ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &saved), 0);
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
    EXPECT_NE(refused.message().find("TEAL's transposed copies"), std::string::npos) << refused;
    EXPECT_NE(refused.message().find("RLIMIT_MEMLOCK"), std::string::npos) << refused;
  }
  ASSERT_TRUE(rows->memory().Lock().ok());
  auto with_rows = LockedBytes();
  ASSERT_TRUE(with_rows.ok()) << with_rows.status();
  EXPECT_GE(*with_rows - *before, static_cast<int64_t>(rows->bytes()));
  absl::Status locked = exec.LockTeal();
  ASSERT_TRUE(locked.ok()) << locked;
  auto with_teal = LockedBytes();
  ASSERT_TRUE(with_teal.ok()) << with_teal.status();
  EXPECT_GE(*with_teal - *with_rows, exec.teal_bytes());
}

// MoE layers split per expert: the router runs on the GPU side, the picks travel with h, each
// side computes its neurons of each chosen expert. Against the single-process FFNs: dense
// (DenseFfn's experts) and exact (SparseFfn within the chosen experts), bit for bit where the
// arithmetic is the same (all hot), else within the reassociation of the down sums.
TEST(SplitWorkerTest, MoeSplitFfnMatchesSingleProcessFfn) {
  for (const char* arch : {"llama", "qwen2moe"}) {
    SCOPED_TRACE(arch);
    auto model = SynthMoe(arch);
    ASSERT_NE(model, nullptr);
    const ModelConfig& c = model->config();
    ThreadPool pool(2);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    const int64_t n = 5;
    std::vector<float> h(n * c.dim);
    for (float& x : h) x = normal(rng);
    for (SparsityMode mode : {SparsityMode::kDense, SparsityMode::kExact}) {
      SCOPED_TRACE(SparsityModeName(mode));
      const SparsityPlan plan = SparsityPlan::Uniform(mode, c.n_layers);
      std::unique_ptr<FfnExecutor> single;
      if (mode == SparsityMode::kDense) {
        single = std::make_unique<DenseFfn>(*model, pool);
      } else {
        auto sparse = SparseFfn::Create(*model, plan, pool);
        ASSERT_TRUE(sparse.ok()) << sparse.status();
        single = std::move(*sparse);
      }
      // -1: a random half of every expert's neurons.
      for (double f : {0.0, 0.5, 1.0, -1.0}) {
        SCOPED_TRACE(f);
        const Placement placement = f < 0 ? RandomPlacement(c, 21) : Placement::Uniform(c, f);
        auto part = Partition::FromPlacement(placement, c);
        ASSERT_TRUE(part.ok()) << part.status();
        auto rows = cpu_worker::ColdRows::Build(*model, *part, std::nullopt, pool);
        ASSERT_TRUE(rows.ok()) << rows.status();
        cpu_worker::ColdExecutor exec(*rows, *part, plan, c.activation, pool);
        auto split = gpu_worker::SplitFfn::Create(*model, plan, *part, pool);
        ASSERT_TRUE(split.ok()) << split.status();
        LoopbackLink link(exec);
        int64_t cold_candidates = 0;
        for (int64_t l = 0; l < c.n_layers; ++l) {
          ASSERT_TRUE(c.layers[l].moe);
          for (int64_t tok = 0; tok < n; ++tok) {
            std::vector<float> got(c.dim), want(c.dim);
            (*split)->BeginStep(&link);
            (*split)->Compute(l, h.data() + tok * c.dim, 1, got.data());
            ASSERT_TRUE((*split)->EndStep().ok());
            single->Compute(l, h.data() + tok * c.dim, 1, want.data());
            cold_candidates += f == 1.0 ? 0 : exec.last_candidates();
            for (int64_t i = 0; i < c.dim; ++i) {
              if (f == 1.0) {
                ASSERT_EQ(got[i], want[i]) << "layer " << l << " token " << tok;
              } else {
                ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::fabs(want[i])))
                    << "layer " << l << " token " << tok;
              }
            }
          }
          // The batch path (rows spread over the pool on both sides) gives the same rows.
          std::vector<float> batch(n * c.dim), one(c.dim);
          (*split)->BeginStep(&link);
          (*split)->Compute(l, h.data(), n, batch.data());
          ASSERT_TRUE((*split)->EndStep().ok());
          for (int64_t tok = 0; tok < n; ++tok) {
            (*split)->BeginStep(&link);
            (*split)->Compute(l, h.data() + tok * c.dim, 1, one.data());
            ASSERT_TRUE((*split)->EndStep().ok());
            for (int64_t i = 0; i < c.dim; ++i) {
              ASSERT_NEAR(batch[tok * c.dim + i], one[i], 1e-5f * (1 + std::fabs(one[i])));
            }
          }
        }
        // Cold work crosses exactly when some neuron is cold: one message per layer and call.
        EXPECT_EQ(link.sent_, f == 1.0 ? 0 : c.n_layers * (2 * n + 1));
        if (f == 0.0) {
          // All cold: each token's picks bring every neuron of their experts.
          EXPECT_EQ(cold_candidates, c.n_layers * n * c.n_experts_used * c.ffn_dim);
        } else if (f != 1.0) {
          EXPECT_GT(cold_candidates, 0);
        }
      }
    }
  }
}

TEST(SplitWorkerTest, ColdExecutorRefusesRoutingThatDoesNotFitTheLayer) {
  auto model = SynthMoe("llama");
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  ThreadPool pool(1);
  auto part = Partition::FromPlacement(Placement::Uniform(c, 0.5), c);
  ASSERT_TRUE(part.ok());
  auto rows = cpu_worker::ColdRows::Build(*model, *part, std::nullopt, pool);
  ASSERT_TRUE(rows.ok());
  const SparsityPlan plan = SparsityPlan::Uniform(SparsityMode::kDense, c.n_layers);
  cpu_worker::ColdExecutor exec(*rows, *part, plan, c.activation, pool);
  std::vector<float> h(c.dim, 0.5f), y(c.dim);
  ipc::ActivationView a;
  a.layer = 1;
  a.rows = 1;
  a.dim = static_cast<uint32_t>(c.dim);
  a.h = absl::MakeConstSpan(h);
  a.all_candidates = true;
  absl::Status s = exec.Compute(a, y);  // no picks on an MoE layer
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs the router's picks"), std::string::npos) << s;
  a.picks = 2;
  a.experts = {0, 4};  // expert 4 of 4
  a.expert_weights = {0.5f, 0.5f};
  s = exec.Compute(a, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expert 4 outside [0, 4)"), std::string::npos) << s;
  a.experts = {0, 3};
  EXPECT_TRUE(exec.Compute(a, y).ok());
  // Per-row candidate lists are the predicted mode's, which MoE layers do not run.
  a.all_candidates = false;
  a.row_end = {0};
  s = exec.Compute(a, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  // Picks on a dense layer are refused too.
  auto stories = Stories();
  const ModelConfig& sc = stories->config();
  auto spart = Partition::FromPlacement(Placement::Uniform(sc, 0.5), sc);
  ASSERT_TRUE(spart.ok());
  auto srows = cpu_worker::ColdRows::Build(*stories, *spart, std::nullopt, pool);
  ASSERT_TRUE(srows.ok());
  const SparsityPlan splan = SparsityPlan::Uniform(SparsityMode::kDense, sc.n_layers);
  cpu_worker::ColdExecutor sexec(*srows, *spart, splan, sc.activation, pool);
  std::vector<float> sh(sc.dim, 0.5f), sy(sc.dim);
  ipc::ActivationView d;
  d.layer = 0;
  d.rows = 1;
  d.dim = static_cast<uint32_t>(sc.dim);
  d.h = absl::MakeConstSpan(sh);
  d.all_candidates = true;
  d.picks = 1;
  d.experts = {0};
  d.expert_weights = {1.0f};
  s = sexec.Compute(d, sy);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the layer has no experts"), std::string::npos) << s;
}

}  // namespace
}  // namespace thermocline
