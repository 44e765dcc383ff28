// --backend and --vram-budget of the programs that spawn the gpu worker
// (shared/driver/gpu_backend_flags.h): what reaches the worker's argv, and each refusal naming
// the problem with the options left as they were.
#include "shared/driver/gpu_backend_flags.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace thermocline::driver {
namespace {

SplitEngineOptions Base() {
  SplitEngineOptions o;
  o.instance = "inst";
  o.model_path = "/m.gguf";
  o.hot_fraction = 0.5;
  o.bindir = "/bin";
  return o;
}

// The value after `flag` in argv, or nullopt when the flag is absent.
std::optional<std::string> ValueOf(const std::vector<std::string>& argv, const std::string& flag) {
  const auto it = std::find(argv.begin(), argv.end(), flag);
  if (it == argv.end() || it + 1 == argv.end()) return std::nullopt;
  return *(it + 1);
}

TEST(GpuBackendFlags, CudaWithABudgetReachesTheWorkerAsBytes) {
  SplitEngineOptions o = Base();
  ASSERT_TRUE(ApplyGpuBackendFlags("cuda", "1.5GiB", o).ok());
  EXPECT_EQ(o.gpu_backend, "cuda");
  const std::vector<std::string> argv = GpuWorkerArgv(o);
  EXPECT_EQ(ValueOf(argv, "--backend"), "cuda");
  EXPECT_EQ(ValueOf(argv, "--vram-budget"), "1610612736");
  // The cpu worker takes neither.
  const std::vector<std::string> cpu = CpuWorkerArgv(o);
  EXPECT_EQ(ValueOf(cpu, "--backend"), std::nullopt);
  EXPECT_EQ(ValueOf(cpu, "--vram-budget"), std::nullopt);
}

TEST(GpuBackendFlags, DefaultsLeaveTheWorkerItsOwn) {
  SplitEngineOptions o = Base();
  ASSERT_TRUE(ApplyGpuBackendFlags("host", std::nullopt, o).ok());
  const std::vector<std::string> argv = GpuWorkerArgv(o);
  // host is the worker's default, so WorkerArgv leaves it out; no budget was asked for.
  EXPECT_EQ(ValueOf(argv, "--backend"), std::nullopt);
  EXPECT_EQ(ValueOf(argv, "--vram-budget"), std::nullopt);

  SplitEngineOptions c = Base();
  ASSERT_TRUE(ApplyGpuBackendFlags("cuda", std::nullopt, c).ok());
  EXPECT_EQ(ValueOf(GpuWorkerArgv(c), "--backend"), "cuda");
  EXPECT_EQ(ValueOf(GpuWorkerArgv(c), "--vram-budget"), std::nullopt);
  SplitEngineOptions z = Base();
  ASSERT_TRUE(ApplyGpuBackendFlags("cuda", "0", z).ok());
  EXPECT_EQ(ValueOf(GpuWorkerArgv(z), "--vram-budget"), "0");
}

void ExpectRefused(const std::string& backend, const std::optional<std::string>& budget,
                   const std::string& message) {
  SplitEngineOptions o = Base();
  const absl::Status s = ApplyGpuBackendFlags(backend, budget, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << backend;
  EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  EXPECT_EQ(o.gpu_backend, "host") << "refused, yet changed";
  EXPECT_TRUE(o.extra_gpu_args.empty()) << "refused, yet changed";
}

TEST(GpuBackendFlags, RefusalsNameTheProblem) {
  ExpectRefused("tpu", std::nullopt, "--backend 'tpu' is not a gpu worker backend; backends: host, cuda");
  ExpectRefused("CUDA", std::nullopt, "backends: host, cuda");
  ExpectRefused("", std::nullopt, "--backend '' is not");
  ExpectRefused("cuda", "6X", "--vram-budget: size '6X': unknown unit 'X'");
  ExpectRefused("cuda", "-1G", "--vram-budget: size '-1G': expected a non-negative number");
  ExpectRefused("cuda", "", "--vram-budget: size '': expected a non-negative number");
  ExpectRefused("cuda", "99999999999TiB", "too large");
  ExpectRefused("host", "6G", "--vram-budget applies to --backend cuda only");
}

}  // namespace
}  // namespace thermocline::driver
