// The offline pipeline through the real commands: `thermocline profile` on stories260K (SiLU)
// and on a synthetic ReLU-gated model, then `thermocline plan` on the stats it wrote, `plan
// --show` and `info` on the plan, and the errors a user sees for bad input.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/model.h"
#include "shared/sparsity/activation_stats.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/planner.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::RunCommand;

std::string Bin() { return testing::BinDir() + "/thermocline"; }
std::string Corpus() { return testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt"; }
std::string Stories() { return testing::ModelPath("stories260K/stories260K.gguf"); }

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(ProfilePlanTest, Stories260KProfileThenPlan) {
  const std::string dir = testing::TempDir();
  const std::string stats = dir + "/stats.gguf", plan = dir + "/plan.gguf";
  auto r = RunCommand({Bin(), "profile", "--model", Stories(), "--corpus", Corpus(), "--tokens",
                       "2048", "--window", "128", "--threads", "2", "-o", stats});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "criterion magnitude")) << r.out;
  EXPECT_TRUE(Contains(r.out, "cut@0.50")) << r.out;
  EXPECT_TRUE(Contains(r.out, "top10%")) << r.out;
  EXPECT_TRUE(Contains(r.err, "profile pass 2/2")) << r.err;  // the progress bar
  auto model = Model::Load(Stories());
  ASSERT_TRUE(model.ok());
  auto s = ReadActivationStats(stats, &(*model)->config());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->criterion, "magnitude");
  EXPECT_EQ(s->tokens, 2048 / 127 * 128);
  EXPECT_EQ(s->targets.size(), 9u);  // 0.1 .. 0.9

  // A budget that holds the dense part (about 1.1 MiB at context 512 with one f16 slot and the
  // probe slot, plus 1 MiB of scratch) and part of the 645 KiB of FFN neurons.
  r = RunCommand({Bin(), "plan", "--model", Stories(), "--stats", stats, "--vram-budget", "2.5MiB",
                  "--context", "512", "--kv-slots", "1", "--kv-type", "f16", "--scratch", "1MiB",
                  "-o", plan});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "expected share of activations served by the GPU")) << r.out;
  EXPECT_TRUE(Contains(r.out, "KV cache (f16, 2 slots x 512)")) << r.out;
  auto p = ReadPlacement(plan, (*model)->config());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->n_gpu_neurons(), 0);
  EXPECT_LT(p->n_gpu_neurons(), 5 * 172);
  EXPECT_GT(p->expected_gpu_share, 0.0);
  EXPECT_LT(p->expected_gpu_share, 1.0);
  EXPECT_EQ(p->vram_capacity, static_cast<int64_t>(2.5 * (1 << 20) + 0.5));
  EXPECT_EQ(p->kv_slots, 1);
  EXPECT_EQ(p->kv_context, 512);
  EXPECT_EQ(p->kv_type, "f16");

  r = RunCommand({Bin(), "plan", "--show", plan});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "placement: 5 layers")) << r.out;
  r = RunCommand({Bin(), "info", plan});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "PWRI")) << r.out;
  EXPECT_TRUE(Contains(r.out, "blk.4.gpu_bucket")) << r.out;

  // Too small a budget: refused, with the bytes missing.
  r = RunCommand({Bin(), "plan", "--model", Stories(), "--stats", stats, "--vram-budget", "64MiB",
                  "-o", dir + "/never.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "cannot hold the dense part")) << r.err;
  EXPECT_TRUE(Contains(r.err, "are missing")) << r.err;
  r = RunCommand({Bin(), "plan", "--model", Stories(), "--stats", stats, "--vram-budget", "6 GB!",
                  "-o", dir + "/never.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "--vram-budget: size '6 GB!': unknown unit 'GB!'")) << r.err;
  // Stats of another model.
  r = RunCommand({Bin(), "plan", "--model", testing::ModelPath("stories260K/stories260K.gguf"),
                  "--stats", plan, "--vram-budget", "1GiB", "-o", dir + "/never.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "expected 'thermocline.stats'")) << r.err;
}

TEST(ProfilePlanTest, ReluSyntheticProfileAndUniformPlan) {
  const std::string dir = testing::TempDir();
  const std::string model = dir + "/relu.gguf", stats = dir + "/stats.gguf";
  auto r =
      RunCommand({Bin(),     "synth",    "--ffn-kind", "relu-gated", "--dim", "64",         "--ffn",
                  "128",     "--layers", "2",          "--heads",    "4",     "--kv-heads", "2",
                  "--vocab", "300",      "--context",  "256",        "-o",    model});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCommand({Bin(), "profile", "-m", model, "--corpus", Corpus(), "--tokens", "1000",
                  "--window", "64", "-o", stats});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.out, "criterion relu")) << r.out;
  EXPECT_TRUE(Contains(r.out, "1 pass\n")) << r.out;
  r = RunCommand({Bin(), "plan", "-m", model, "--stats", stats, "--hot-fraction", "0.25", "-o",
                  dir + "/uniform.gguf"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto p = ReadPlacement(dir + "/uniform.gguf");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->n_gpu_neurons(), 2 * 32);
  EXPECT_GT(p->expected_gpu_share, 0.25);  // the hottest quarter carries more than a quarter
}

TEST(ProfilePlanTest, ProfileRejectsBadOptions) {
  const std::string out = testing::TempDir() + "/x.gguf";
  auto r = RunCommand(
      {Bin(), "profile", "-m", Stories(), "--corpus", Corpus(), "--targets", "0.3,abc", "-o", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "--targets: 'abc' is not a number")) << r.err;
  r = RunCommand(
      {Bin(), "profile", "-m", Stories(), "--corpus", Corpus(), "--targets", "0.3,0.7", "-o", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "--frequency-target 0.5 must be one of the --targets")) << r.err;
  r = RunCommand(
      {Bin(), "profile", "-m", Stories(), "--corpus", Corpus(), "--window", "4096", "-o", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "--window 4096 must be in [2, 2048]")) << r.err;
  r = RunCommand({Bin(), "profile", "-m", Stories(), "--corpus", "/nonexistent.txt", "-o", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Contains(r.err, "/nonexistent.txt")) << r.err;
}

}  // namespace
}  // namespace thermocline
