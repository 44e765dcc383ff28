// The two worker processes end to end: the test plays the gateway (creates the transport,
// spawns thermocline-gpu-worker and thermocline-cpu-worker, sends Steps, reads Logits) and
// compares every logits row with the single-process engine (ForwardPass with DenseFfn or
// SparseFfn under the same plan) on stories260K (SwiGLU) and a synthetic ReLU model, at hot
// fractions 0, 0.5 and 1. Also: a bad Step gets an Error and the next one works; a cpu worker
// killed while the gpu worker waits is reported as Unavailable and a restarted one serves the
// retried step; a clean shutdown and a kill leave nothing in /dev/shm.
//
// The logits bound. Every neuron's product is bit-identical to the single-process engine's
// (neuron_ffn.h), and both sides filter with the same SparsityPlan::FilterFor, so the two
// compute the same neurons. What may differ is the order of the down projection's sum:
//   - bit-identical (bound 0) where the order is the same: hot fraction 1 (dense layers run
//     DenseFfn; sparse layers run NeuronFfn over all neurons exactly as SparseFfn does with one
//     thread) and hot fraction 0 in the sparse modes (the CPU worker runs NeuronFfn over every
//     candidate, in order, as SparseFfn does; the GPU side adds it to an exact 0);
//   - elsewhere (dense at hot 0: NeuronFfn's axpy over rows instead of DenseFfn's dot products;
//     any mode at 0.5: y_hot + y_cold instead of one running sum) float reassociation: each
//     FFN output element of n terms moves by at most ~n * 2^-24 * sum|terms| per layer, which
//     the following layers carry to the logits. At these sizes (ffn_dim 172 and 128, values of
//     order 1) that is ~1e-5 of an FFN output; through 5 layers and the head it stays well under
//     1e-4 of the logits' RMS, so the bound is 1e-4 * max(1, RMS). Measured on these cases:
//     at most 1e-6 * max(1, RMS), a margin of 100.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/ipc/messages.h"
#include "shared/ipc/transport.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "tests/integration/worker_instance.h"
#include "tests/process_spawn.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using ipc::Role;
using testing::WorkerInstance;

// Relative to max(1, RMS of the reference logits); see the top of the file.
constexpr double kTolerance = 1e-4;

std::string Stories() { return testing::ModelPath("stories260K/stories260K.gguf"); }
std::string Corpus() { return testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt"; }


// Activation statistics of stories260K for the threshold mode, once per test binary.
const std::string& StoriesStats() {
  static const std::string path = [] {
    const std::string out = testing::TempDir() + "/stories-stats.gguf";
    auto r = testing::RunCommand({testing::BinDir() + "/thermocline", "profile", "-m", Stories(),
                                  "--corpus", Corpus(), "--tokens", "600", "--window", "64", "--targets", "0.2,0.5",
                                  "--threads", "1", "-o", out});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
  }();
  return path;
}

bool ShmLeftFor(const std::string& instance) {
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind("thermocline-" + instance, 0) == 0) return true;
  }
  return false;
}

// The steps every comparison runs: a multi-position prompt in slot 0 mixed with a shorter one
// in slot 1, then decode steps for both (logits wanted for every entry but one).
std::vector<std::vector<ipc::StepEntry>> Steps(int32_t vocab) {
  std::vector<std::vector<ipc::StepEntry>> steps(4);
  for (int32_t p = 0; p < 6; ++p) {
    steps[0].push_back({0, p, 1 + (p * 37) % (vocab - 1), p == 2 ? 0u : ipc::kEntryWantsLogits});
  }
  for (int32_t p = 0; p < 3; ++p) steps[0].push_back({1, p, 1 + (p * 91) % (vocab - 1), 1});
  for (int32_t s = 1; s < 4; ++s) {
    steps[s].push_back({0, 5 + s, (s * 53) % vocab, ipc::kEntryWantsLogits});
    steps[s].push_back({1, 2 + s, (s * 17) % vocab, ipc::kEntryWantsLogits});
  }
  return steps;
}

// The single-process engine's logits for the same steps.
std::vector<std::vector<float>> Reference(const std::string& model_path, const SparsityFlags& flags) {
  auto model = Model::Load(model_path);
  EXPECT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  ThreadPool pool(1);
  auto plan = SparsityPlanFromFlags(**model, flags);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::unique_ptr<SparseFfn> sparse;
  if (!plan->AllDense()) sparse = std::move(*SparseFfn::Create(**model, *plan, pool));
  auto kv = KvCache::Create(c, 2, c.context_length, GgmlType::kF32);
  ForwardPass pass(**model, *kv, pool, sparse.get());
  std::vector<std::vector<float>> out;
  for (const auto& step : Steps(static_cast<int32_t>(c.vocab_size))) {
    std::vector<BatchEntry> batch;
    for (const ipc::StepEntry& e : step) {
      batch.push_back({e.kv_slot, e.position, e.token_id, e.flags != 0});
    }
    std::vector<float> logits;
    EXPECT_TRUE(pass.Run(batch, logits).ok());
    out.push_back(logits);
  }
  return out;
}

struct SplitCase {
  std::string model;
  std::string mode;
  std::vector<std::string> extra;  // more sparsity flags
  double hot_fraction;
};

std::vector<std::string> WorkerArgs(const SplitCase& sc) {
  std::vector<std::string> a = {"--model", sc.model, "--threads", "1", "--hot-fraction",
                                absl::StrCat(sc.hot_fraction), "--sparsity", sc.mode};
  a.insert(a.end(), sc.extra.begin(), sc.extra.end());
  return a;
}

SparsityFlags FlagsOf(const SplitCase& sc) {
  SparsityFlags f;
  f.mode = sc.mode;
  for (size_t i = 0; i + 1 < sc.extra.size(); i += 2) {
    if (sc.extra[i] == "--stats") f.stats_path = sc.extra[i + 1];
    if (sc.extra[i] == "--target-sparsity") f.target_sparsity = std::stof(sc.extra[i + 1]);
  }
  return f;
}

// Runs the steps through both workers and compares with the reference; returns the largest
// |difference| / max(1, RMS) seen.
double CompareSplit(const SplitCase& sc) {
  SCOPED_TRACE(absl::StrCat(sc.model, " ", sc.mode, " hot ", sc.hot_fraction));
  const auto reference = Reference(sc.model, FlagsOf(sc));
  auto model = Model::Load(sc.model);
  const uint32_t vocab = static_cast<uint32_t>((*model)->config().vocab_size);
  WorkerInstance inst("cmp");
  EXPECT_TRUE(inst.StartWorkers(WorkerArgs(sc))) << inst.Log();
  const auto steps = Steps(static_cast<int32_t>(vocab));
  // Bit-identical where the summation order is the same (see the top of the file).
  const bool same_order =
      sc.hot_fraction == 1.0 || (sc.hot_fraction == 0.0 && sc.mode != "dense");
  double worst = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    inst.Send(100 + s, steps[s]);
    auto logits = inst.Reply(100 + s, vocab);
    EXPECT_TRUE(logits.ok()) << logits.status() << "\n" << inst.Log();
    if (!logits.ok()) return worst;
    const std::vector<float>& ref = reference[s];
    EXPECT_EQ(logits->size(), ref.size());
    if (logits->size() != ref.size()) return worst;
    double sq = 0, max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      sq += double{ref[i]} * ref[i];
      max_diff = std::max(max_diff, std::fabs(double{(*logits)[i]} - ref[i]));
    }
    const double scale = std::max(1.0, std::sqrt(sq / ref.size()));
    worst = std::max(worst, max_diff / scale);
    if (same_order) {
      EXPECT_EQ(*logits, ref) << "step " << s << ": max |diff| " << max_diff;
    } else {
      EXPECT_LE(max_diff, kTolerance * scale) << "step " << s;
    }
  }
  inst.SendShutdown();
  std::cerr << "split " << sc.mode << " hot " << sc.hot_fraction << ": max |diff| / scale "
            << worst << "\n";
  return worst;
}

TEST(WorkerProcessesTest, StoriesDenseMatchesSingleProcess) {
  for (double hot : {0.0, 0.5, 1.0}) CompareSplit({Stories(), "dense", {}, hot});
}

TEST(WorkerProcessesTest, StoriesThresholdMatchesSingleProcess) {
  for (double hot : {0.0, 0.5, 1.0}) {
    CompareSplit({Stories(), "threshold", {"--stats", StoriesStats(), "--target-sparsity", "0.5"},
                  hot});
  }
}

TEST(WorkerProcessesTest, ReluModelAllModesMatchSingleProcess) {
  for (const std::string mode : {"dense", "exact", "predicted"}) {
    for (double hot : {0.0, 0.5, 1.0}) CompareSplit({testing::ReluWorkerModel(), mode, {}, hot});
  }
}

TEST(WorkerProcessesTest, BadStepGetsErrorAndNextStepWorks) {
  const SplitCase sc{Stories(), "dense", {}, 0.5};
  const auto reference = Reference(sc.model, FlagsOf(sc));
  WorkerInstance inst("bad");
  ASSERT_TRUE(inst.StartWorkers(WorkerArgs(sc))) << inst.Log();
  inst.Send(1, {{99, 0, 5, ipc::kEntryWantsLogits}});  // slot out of range
  auto bad = inst.Reply(1, 512);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("kv_slot 99"), std::string::npos) << bad.status();
  inst.Send(2, {{0, 3, 5, ipc::kEntryWantsLogits}});  // skips ahead of an empty slot
  auto skip = inst.Reply(2, 512);
  EXPECT_EQ(skip.status().code(), absl::StatusCode::kInvalidArgument) << skip.status();
  inst.Send(3, Steps(512)[0]);
  auto good = inst.Reply(3, 512);
  ASSERT_TRUE(good.ok()) << good.status() << "\n" << inst.Log();
  ASSERT_EQ(good->size(), reference[0].size());
  for (size_t i = 0; i < good->size(); ++i) {
    ASSERT_NEAR((*good)[i], reference[0][i], 1e-3) << i;
  }
  // A step whose entries want no logits is answered with zero rows.
  inst.Send(4, {{1, 3, 7, 0}});
  auto none = inst.Reply(4, 512);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST(WorkerProcessesTest, KilledCpuWorkerIsReportedAndRestartedOneServesTheRetry) {
  const SplitCase sc{Stories(), "dense", {}, 0.5};
  const auto reference = Reference(sc.model, FlagsOf(sc));
  std::string instance;
  {
    WorkerInstance inst("kill");
    instance = inst.name();
    pid_t gpu = 0, cpu = 0;
    ASSERT_TRUE(inst.StartWorkers(WorkerArgs(sc), &gpu, &cpu)) << inst.Log();
    const auto steps = Steps(512);
    inst.Send(1, steps[0]);
    ASSERT_TRUE(inst.Reply(1, 512).ok()) << inst.Log();

    // The gpu worker sends layer 0's Activation and waits for a Partial that never comes.
    WorkerInstance::Kill(cpu);
    inst.Send(2, steps[1]);
    auto lost = inst.Reply(2, 512, absl::Seconds(5));
    EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable) << lost.status();
    EXPECT_NE(lost.status().message().find("cpu worker"), std::string::npos) << lost.status();

    // What the driver does: a new epoch, a new cpu worker, the same positions under a new id.
    ASSERT_TRUE(inst.transport().BumpEpoch().ok());
    inst.AdoptEpoch();
    cpu = inst.Spawn("thermocline-cpu-worker", WorkerArgs(sc));
    ASSERT_TRUE(inst.WaitReady(Role::kCpuWorker, cpu)) << inst.Log();
    inst.Send(3, steps[1]);
    auto retried = inst.Reply(3, 512);
    ASSERT_TRUE(retried.ok()) << retried.status() << "\n" << inst.Log();
    ASSERT_EQ(retried->size(), reference[1].size());
    for (size_t i = 0; i < retried->size(); ++i) {
      ASSERT_NEAR((*retried)[i], reference[1][i], 1e-3) << i;
    }
    // Kill everything; the WorkerInstance's destructor removes the segment.
    WorkerInstance::Kill(gpu);
    WorkerInstance::Kill(cpu);
  }
  EXPECT_FALSE(ShmLeftFor(instance));
}

TEST(WorkerProcessesTest, ShutdownStopsBothWorkersCleanly) {
  const SplitCase sc{testing::ReluWorkerModel(), "exact", {}, 0.5};
  std::string instance;
  {
    WorkerInstance inst("stop");
    instance = inst.name();
    pid_t gpu = 0, cpu = 0;
    ASSERT_TRUE(inst.StartWorkers(WorkerArgs(sc), &gpu, &cpu)) << inst.Log();
    inst.SendShutdown();
    EXPECT_EQ(inst.WaitExit(gpu), 0) << inst.Log();
    EXPECT_EQ(inst.WaitExit(cpu), 0) << inst.Log();
    EXPECT_EQ(inst.transport().Process(Role::kGpuWorker).state, ipc::ProcessState::kStopped);
    EXPECT_EQ(inst.transport().Process(Role::kCpuWorker).state, ipc::ProcessState::kStopped);
  }
  EXPECT_FALSE(ShmLeftFor(instance));
}

TEST(WorkerProcessesTest, SigtermAndTheGatewaysExitStopTheWorkers) {
  const SplitCase sc{testing::ReluWorkerModel(), "dense", {}, 0.5};
  auto inst = std::make_unique<WorkerInstance>("owner");
  const std::string instance = inst->name();
  pid_t gpu = 0, cpu = 0;
  ASSERT_TRUE(inst->StartWorkers(WorkerArgs(sc), &gpu, &cpu)) << inst->Log();
  kill(cpu, SIGTERM);
  EXPECT_EQ(inst->WaitExit(cpu), 0) << inst->Log();
  EXPECT_EQ(inst->transport().Process(Role::kCpuWorker).state, ipc::ProcessState::kStopped);
  inst->Forget(gpu);
  inst.reset();  // the gateway's transport goes: the owner is cleared and the segment removed
  EXPECT_EQ(WorkerInstance::WaitExitOf(gpu), 0);
  EXPECT_FALSE(ShmLeftFor(instance));
}

TEST(WorkerProcessesTest, HelpAndBadFlags) {
  for (const std::string bin : {"thermocline-gpu-worker", "thermocline-cpu-worker"}) {
    auto r = testing::RunCommand({testing::BinDir() + "/" + bin, "--help"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("--hot-fraction"), std::string::npos) << r.out;
    r = testing::RunCommand({testing::BinDir() + "/" + bin, "--instance", "x", "--model",
                             Stories()});
    EXPECT_NE(r.exit_code, 0);
  }
  // An unknown backend is a usage error (--backend cuda is valid in CUDA builds: docs/cuda.md).
  auto r = testing::RunCommand({testing::BinDir() + "/thermocline-gpu-worker", "--instance",
                                "x", "--model", Stories(), "--hot-fraction", "1", "--backend",
                                "tpu"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--backend tpu"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace thermocline
