// --backend and --vram-budget on the real thermocline-gateway (spawn mode) and
// `thermocline generate --split` processes: bad values are refused before anything starts,
// naming the flag and what is allowed; --backend cuda on a machine that cannot run it (built
// without CUDA, or no usable device) ends the program at start with exit status 1 and the gpu
// worker's own reason on stderr, not a hang. Where a device is usable, the split generation
// runs on it instead.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shared/driver/default_placement.h"
#include "tests/test_support.h"

namespace thermocline::testing {
namespace {

bool Contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

std::string Bin(const std::string& name) { return absl::StrCat(BinDir(), "/", name); }

class BackendFlags : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir());
    model_ = new std::string(*dir_ + "/tiny.gguf");
    const CommandResult synth =
        RunCommand({Bin("thermocline"), "synth", "--dim", "64", "--ffn", "128", "--layers", "2",
                    "--heads", "4", "--kv-heads", "2", "--vocab", "300", "--context", "64",
                    "-o", *model_});
    ASSERT_EQ(synth.exit_code, 0) << synth.err;
    // What the gpu worker says of --backend cuda on this machine: it checks before attaching,
    // so the probe needs no instance; exit 2 with its logfmt line "... component=gpu_worker
    // event=start_failed error=\"--backend cuda: ...\"" is the refusal (built without CUDA, or
    // no usable device) that must reach the user, and past that check (exit 1: no such
    // instance) a device is usable. The line is kept from "level=" on: the gateway's copy has
    // its own ts.
    const CommandResult probe =
        RunCommand({Bin("thermocline-gpu-worker"), "--backend", "cuda", "--instance",
                    absl::StrCat("backend-probe-", getpid()), "--model", *model_,
                    "--hot-fraction", "1"});
    const std::string line = probe.err.substr(0, probe.err.find('\n'));
    if (probe.exit_code == 2 &&
        Contains(line, "level=error component=gpu_worker event=start_failed "
                       "error=\"--backend cuda: ")) {
      refusal_ = new std::string(line.substr(line.find("level=")));
    } else {
      ASSERT_EQ(probe.exit_code, 1) << probe.err;
      ASSERT_TRUE(Contains(probe.err, "component=gpu_worker event=attach_failed")) << probe.err;
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete model_;
    delete refusal_;
  }

  static std::vector<std::string> Gateway(std::vector<std::string> extra) {
    std::vector<std::string> argv = {Bin("thermocline-gateway"), "--model", *model_,
                                     "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                     "--instance", absl::StrCat("backend-flags-", getpid())};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  static std::vector<std::string> Generate(std::vector<std::string> extra) {
    std::vector<std::string> argv = {Bin("thermocline"), "generate", "--model", *model_,
                                     "--prompt", "ab", "--max-new-tokens", "2",
                                     "--temperature", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  static void ExpectRefused(const std::vector<std::string>& argv, const std::string& message) {
    const CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(Contains(r.err, message)) << "wanted '" << message << "' in:\n" << r.err;
    // Refused while reading the flags: no worker was started.
    EXPECT_FALSE(Contains(r.err, "gpu_worker")) << r.err;
  }

  static std::string* dir_;
  static std::string* model_;
  static std::string* refusal_;  // the gpu worker's line, or null where cuda runs
};
std::string* BackendFlags::dir_ = nullptr;
std::string* BackendFlags::model_ = nullptr;
std::string* BackendFlags::refusal_ = nullptr;

TEST_F(BackendFlags, HelpListsThem) {
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{Bin("thermocline-gateway"), "--help"},
        std::vector<std::string>{Bin("thermocline"), "generate", "--help"}}) {
    const CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(Contains(r.out, "--backend arg (=host)")) << r.out;
    EXPECT_TRUE(Contains(r.out, "--vram-budget arg")) << r.out;
  }
}

TEST_F(BackendFlags, GatewayRefusesBadValues) {
  ExpectRefused(Gateway({"--backend", "tpu", "--hot-fraction", "1"}),
                "thermocline-gateway: --backend 'tpu' is not a gpu worker backend; backends: "
                "host, cuda");
  ExpectRefused(Gateway({"--backend", "cuda", "--hot-fraction", "0.5", "--vram-budget", "6X"}),
                "thermocline-gateway: --vram-budget: size '6X': unknown unit 'X'");
  ExpectRefused(Gateway({"--vram-budget", "6G"}),
                "--vram-budget applies to --backend cuda only");
  ExpectRefused(Gateway({"--workers", "attach", "--backend", "cuda", "--hot-fraction", "1"}),
                "with --workers attach give them to thermocline-gpu-worker");
  // How the workers start is theirs to say in attach mode; the gateway would ignore it.
  for (const std::vector<std::string>& spawn_only : {std::vector<std::string>{"--mlock"},
                                                     {"--cpus", "0"},
                                                     {"--numa-node", "0"},
                                                     {"--gpu-threads", "2"},
                                                     {"--cpu-threads", "2"}}) {
    std::vector<std::string> args = {"--workers", "attach", "--hot-fraction", "1"};
    args.insert(args.end(), spawn_only.begin(), spawn_only.end());
    ExpectRefused(Gateway(args), spawn_only[0] +
                                     " sets how the gateway starts its workers; with --workers "
                                     "attach give the workers' own flags");
  }
}

TEST_F(BackendFlags, GenerateRefusesBadValues) {
  ExpectRefused(Generate({"--split", "--backend", "tpu", "--hot-fraction", "1"}),
                "thermocline generate: --backend 'tpu' is not a gpu worker backend; backends: "
                "host, cuda");
  ExpectRefused(Generate({"--split", "--backend", "cuda", "--hot-fraction", "1",
                          "--vram-budget", "1.2.3G"}),
                "--vram-budget: size '1.2.3G': unknown unit '.3G'");
  ExpectRefused(Generate({"--split", "--hot-fraction", "1", "--vram-budget", "1G"}),
                "--vram-budget applies to --backend cuda only");
  ExpectRefused(Generate({"--backend", "cuda"}), "--backend needs --split");
  ExpectRefused(Generate({"--vram-budget", "1G"}), "--vram-budget needs --split");
  ExpectRefused({Bin("thermocline"), "generate", "--server", "127.0.0.1:1", "--prompt", "x",
                 "--backend", "cuda"},
                "--backend is for local generation; the gateway has its own");
}

TEST_F(BackendFlags, GenerateSplitOnCudaFailsAtStartWithTheWorkersReason) {
  const CommandResult r =
      RunCommand(Generate({"--split", "--backend", "cuda", "--hot-fraction", "0.5",
                           "--vram-budget", "1G"}));
  if (refusal_ == nullptr) {
    // A usable device: the same command generates on it.
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(Contains(r.err, "decode: 2 tokens")) << r.err;
    return;
  }
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(Contains(r.err, *refusal_)) << "wanted '" << *refusal_ << "' in:\n" << r.err;
  EXPECT_TRUE(Contains(r.err, "thermocline generate: gpu_worker (")) << r.err;
  EXPECT_TRUE(Contains(r.err, "exited with status 2 while starting")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(BackendFlags, GatewayOnCudaFailsAtStartWithTheWorkersReason) {
  if (refusal_ == nullptr) {
    GTEST_SKIP() << "a CUDA device is usable here: the gateway would serve on it (the GPU tests "
                    "cover that)";
  }
  const CommandResult r =
      RunCommand(Gateway({"--backend", "cuda", "--hot-fraction", "0.5", "--vram-budget", "1G"}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(Contains(r.err, *refusal_)) << "wanted '" << *refusal_ << "' in:\n" << r.err;
  EXPECT_TRUE(Contains(r.err, "thermocline-gateway: gpu_worker (")) << r.err;
  EXPECT_TRUE(Contains(r.err, "exited with status 2 while starting")) << r.err;
  EXPECT_TRUE(Contains(r.err, "backend=cuda")) << r.err;
}


// `--device-memory` is what the default placement reads: one logfmt line with the device's free
// and total memory where a device is usable, else the worker's reason and a failing status.
TEST_F(BackendFlags, GpuWorkerReportsTheDevicesMemoryOrWhyNot) {
  const CommandResult r = RunCommand({Bin("thermocline-gpu-worker"), "--device-memory"});
  if (refusal_ == nullptr) {
    ASSERT_EQ(r.exit_code, 0) << r.err;
    absl::StatusOr<driver::DeviceMemory> m =
        driver::ParseDeviceMemoryLine(r.out.substr(0, r.out.find('\n')));
    ASSERT_TRUE(m.ok()) << m.status() << "\n" << r.out;
    EXPECT_GT(m->free_bytes, 0);
    EXPECT_FALSE(m->name.empty());
    return;
  }
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(Contains(r.err, "component=gpu_worker event=start_failed error=\"--device-memory: "))
      << r.err;
  // The same reason --backend cuda gives (no CUDA in this build, or no usable device).
  const bool no_cuda_build = Contains(*refusal_, "built without CUDA");
  EXPECT_TRUE(Contains(r.err, no_cuda_build ? "built without CUDA" : "no usable CUDA device"))
      << r.err;
  const absl::StatusOr<driver::DeviceMemory> probed =
      driver::ProbeDeviceMemory(Bin("thermocline-gpu-worker"));
  ASSERT_FALSE(probed.ok());
  EXPECT_TRUE(Contains(std::string(probed.status().message()),
                       no_cuda_build ? "built without CUDA" : "no usable CUDA device"))
      << probed.status();
}

// Neither --plan nor --hot-fraction with --backend cuda: the program plans for --vram-budget
// (logged, removed at exit), then the worker starts on the device, or says why it cannot.
TEST_F(BackendFlags, CudaWithoutAPlacementIsPlannedForTheBudget) {
  const CommandResult r = RunCommand(Gateway({"--backend", "cuda", "--vram-budget", "1G"}));
  EXPECT_TRUE(Contains(r.err, "component=gateway event=placement_default plan=")) << r.err;
  EXPECT_TRUE(Contains(r.err, "budget_bytes=1073741824 gpu_ffn_share=1 why=\"planned for 1.00 "
                              "GiB from --vram-budget; no --stats"))
      << r.err;
  const size_t at = r.err.find("event=placement_default plan=");
  ASSERT_NE(at, std::string::npos);
  const size_t begin = at + std::string("event=placement_default plan=").size();
  const std::string plan = r.err.substr(begin, r.err.find(' ', begin) - begin);
  EXPECT_FALSE(std::filesystem::exists(plan)) << plan << " outlived the gateway";
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(plan).parent_path())) << plan;
  if (refusal_ != nullptr) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(Contains(r.err, *refusal_)) << "wanted '" << *refusal_ << "' in:\n" << r.err;
  }

  const CommandResult g = RunCommand(Generate({"--split", "--backend", "cuda", "--vram-budget", "1G"}));
  EXPECT_TRUE(Contains(g.err, "thermocline generate: no --hot-fraction or --plan; 100.0% of the "
                              "FFN's bytes on the device: planned for 1.00 GiB from --vram-budget"))
      << g.err;
  if (refusal_ != nullptr) {
    EXPECT_EQ(g.exit_code, 1) << g.err;
    EXPECT_TRUE(Contains(g.err, *refusal_)) << "wanted '" << *refusal_ << "' in:\n" << g.err;
  } else {
    EXPECT_EQ(g.exit_code, 0) << g.err;
  }
}

// Without a budget the device's free memory is read; where it cannot be, the refusal says what
// the worker said and which flags avoid the probe, before any worker of the instance starts.
TEST_F(BackendFlags, CudaWithoutAPlacementOrBudgetNeedsTheDevice) {
  if (refusal_ == nullptr) {
    GTEST_SKIP() << "a CUDA device is usable here: the plan is made from its free memory and the "
                    "gateway serves (the GPU tests cover that)";
  }
  const bool no_cuda_build = Contains(*refusal_, "built without CUDA");
  const std::string reason = no_cuda_build ? "built without CUDA" : "no usable CUDA device";
  for (const auto& argv : {Gateway({"--backend", "cuda"}),
                           Generate({"--split", "--backend", "cuda"})}) {
    const CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(Contains(r.err, "--backend cuda without --plan or --hot-fraction plans from the "
                                "device's free memory, which could not be read: "))
        << r.err;
    EXPECT_TRUE(Contains(r.err, reason)) << r.err;
    EXPECT_TRUE(Contains(r.err, "Give --vram-budget, --plan or --hot-fraction")) << r.err;
    EXPECT_FALSE(Contains(r.err, "placement_default")) << r.err;
  }
}

}  // namespace
}  // namespace thermocline::testing
