// The placement a split engine gets without --plan or --hot-fraction (default_placement.h), on
// stories260K: the host backend keeps the whole FFN hot; a device budget without statistics
// gets a uniform share by bytes that fills the budget as far as one more slice allows; with
// `thermocline profile`'s statistics the plan is the very file `thermocline plan` writes for
// the same budget and KV cache; a budget below the dense part is refused naming the budget's
// source; a plan in its own directory is removed with it.
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/driver/default_placement.h"
#include "shared/model/model.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/planner.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using driver::ChooseDefaultPlacement;
using driver::DefaultPlacementOptions;

std::string Stories() { return testing::ModelPath("stories260K/stories260K.gguf"); }

DefaultPlacementOptions CudaOptions(int64_t budget, const std::string& plan_path) {
  DefaultPlacementOptions o;
  o.gpu_backend = "cuda";
  o.model_path = Stories();
  o.vram_budget = budget;
  o.context = 512;
  o.kv_slots = 3;
  o.kv_type = "f16";
  o.plan_path = plan_path;
  return o;
}

TEST(DefaultPlacementTest, HostBackendKeepsTheWholeFfnHot) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  DefaultPlacementOptions o;
  o.model_path = Stories();
  absl::StatusOr<driver::DefaultPlacement> d = ChooseDefaultPlacement(o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->hot_fraction.has_value());
  EXPECT_EQ(*d->hot_fraction, 1.0);
  EXPECT_TRUE(d->plan_path.empty());
}

TEST(DefaultPlacementTest, WithoutStatsAUniformShareFillsTheBudget) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  auto model = Model::Load(Stories());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const LayerWeights& w0 = (*model)->layer(0);
  ASSERT_EQ(w0.gate.type, GgmlType::kF32);  // so that a neuron's bytes are 3 f32 rows
  const int64_t neuron_bytes = 3 * c.dim * static_cast<int64_t>(sizeof(float));
  PlannerOptions po;
  po.context = 512;
  po.kv_slots = 3;
  po.kv_type = "f16";
  const int64_t dense = ChargeDense(**model, po).total();
  const int64_t ffn_bytes = c.n_layers * c.ffn_dim * neuron_bytes;
  const std::string dir = testing::TempDir();
  for (double share : {0.3, 0.55, 0.8}) {
    const int64_t budget = dense + static_cast<int64_t>(share * ffn_bytes);
    const std::string path = absl::StrCat(dir, "/plan-", share, ".gpuidx");
    absl::StatusOr<driver::DefaultPlacement> d = ChooseDefaultPlacement(CudaOptions(budget, path));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_FALSE(d->ranked_by_stats);
    EXPECT_EQ(d->budget, budget);
    EXPECT_EQ(d->budget_source, "--vram-budget");
    auto p = ReadPlacement(path, c);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->kv_slots, 3);
    EXPECT_EQ(p->kv_context, 512);
    EXPECT_EQ(p->kv_type, "f16");
    int64_t lo = c.ffn_dim, hi = 0, placed = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const int64_t n = static_cast<int64_t>(p->layers[l].gpu_bucket.size());
      lo = std::min(lo, n);
      hi = std::max(hi, n);
      placed += n;
    }
    // Every layer alike and nothing known of its neurons: the layers differ by at most one
    // slice (kSliceAlign), plus the short last step to ffn_dim that a layer may take when
    // another's full slice no longer fits; the placed bytes fit, and no layer's next step would.
    EXPECT_LE(hi - lo, kSliceAlign + c.ffn_dim % kSliceAlign) << share;
    EXPECT_LE(placed * neuron_bytes, budget - dense) << share;
    const int64_t left = budget - dense - placed * neuron_bytes;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const int64_t n = static_cast<int64_t>(p->layers[l].gpu_bucket.size());
      if (n == c.ffn_dim) continue;
      const int64_t next = n == 0 ? std::max<int64_t>(32, kSliceAlign)
                                  : std::min(kSliceAlign, c.ffn_dim - n);
      EXPECT_GT(next * neuron_bytes, left) << "layer " << l << " at share " << share;
    }
    EXPECT_NEAR(d->gpu_ffn_share, static_cast<double>(placed) / (c.n_layers * c.ffn_dim), 1e-9);
    EXPECT_NEAR(d->gpu_ffn_share, share, 2.0 * kSliceAlign / c.ffn_dim) << share;
  }
}

TEST(DefaultPlacementTest, WithStatsItIsThePlanThermoclinePlanWrites) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  const std::string dir = testing::TempDir();
  const std::string bin = testing::BinDir() + "/thermocline";
  const std::string stats = dir + "/stats.gguf";
  auto r = testing::RunCommand({bin, "profile", "--model", Stories(), "--corpus",
                                testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt",
                                "--tokens", "1024", "--window", "128", "-o", stats});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto model = Model::Load(Stories());
  ASSERT_TRUE(model.ok()) << model.status();
  PlannerOptions po;
  po.context = 512;
  po.kv_slots = 3;
  po.kv_type = "f16";
  const int64_t budget = ChargeDense(**model, po).total() + (int64_t{320} << 10);  // half the FFN
  const std::string cli_plan = dir + "/cli.gpuidx", default_plan = dir + "/default.gpuidx";
  r = testing::RunCommand({bin, "plan", "--model", Stories(), "--stats", stats, "--vram-budget",
                           absl::StrCat(budget), "--context", "512", "--kv-slots", "3",
                           "--kv-type", "f16", "-o", cli_plan});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  DefaultPlacementOptions o = CudaOptions(budget, default_plan);
  o.stats_path = stats;
  absl::StatusOr<driver::DefaultPlacement> d = ChooseDefaultPlacement(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->ranked_by_stats);
  EXPECT_GT(d->gpu_ffn_share, 0.0);
  EXPECT_LT(d->gpu_ffn_share, 1.0);
  EXPECT_EQ(testing::ReadFileOrDie(default_plan), testing::ReadFileOrDie(cli_plan));
}

TEST(DefaultPlacementTest, ABudgetBelowTheDensePartIsRefusedNamingItsSource) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  const std::string dir = testing::TempDir();
  absl::StatusOr<driver::DefaultPlacement> d =
      ChooseDefaultPlacement(CudaOptions(int64_t{1} << 20, dir + "/never.gpuidx"));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("planning for 1.00 MiB from --vram-budget: "),
            std::string::npos)
      << d.status();
  EXPECT_NE(d.status().message().find("cannot hold the dense part"), std::string::npos)
      << d.status();
  EXPECT_FALSE(std::filesystem::exists(dir + "/never.gpuidx"));
}

TEST(DefaultPlacementTest, APlanInItsOwnDirectoryIsRemovedWithIt) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  const std::string dir = testing::TempDir();
  const char* old = getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("TMPDIR", dir.c_str(), 1);
  absl::StatusOr<driver::DefaultPlacement> d = ChooseDefaultPlacement(CudaOptions(int64_t{1} << 30, ""));
  if (old != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->gpu_ffn_share, 1.0);  // 1 GiB holds all of stories260K
  EXPECT_EQ(d->plan_path.rfind(dir + "/thermocline-plan-", 0), 0u) << d->plan_path;
  EXPECT_EQ(d->plan_path, d->plan_dir + "/plan.gpuidx");
  ASSERT_TRUE(std::filesystem::exists(d->plan_path));
  driver::RemoveDefaultPlan(*d);
  EXPECT_FALSE(std::filesystem::exists(d->plan_dir));
}

}  // namespace
}  // namespace thermocline
