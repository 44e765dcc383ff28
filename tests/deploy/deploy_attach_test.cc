// Attach mode as thermocline.target runs it (deploy/, docs/operations.md "Run"): the gateway
// with --workers attach and the two workers started as separate processes with the flags of
// the example configuration, the workers first (they retry the attach while the gateway is not
// there yet, as their units do). It serves; after kill -9 of a worker the gateway exits 1
// naming the reason, the surviving worker exits on its own, and a fresh set of processes (what
// systemd's restarts produce) serves the same answer again.
#include <gtest/gtest.h>

#include "shared/ipc/segment.h"
#include "tests/deploy/deploy_process.h"
#include "tests/e2e/gateway_harness.h"

namespace thermocline::testing {
namespace {

struct Instance {
  explicit Instance(const std::string& name, int round) {
    const std::string m = Stories260K();
    const std::string dir = TempDir();
    const std::vector<std::string> placement = {"--instance", name, "--model", m,
                                                "--hot-fraction", "0.5", "--threads", "1"};
    std::vector<std::string> gpu = {BinDir() + "/thermocline-gpu-worker"};
    gpu.insert(gpu.end(), placement.begin(), placement.end());
    gpu.insert(gpu.end(), {"--backend", "host", "--kv-slots", "5", "--context", "256",
                           "--max-batch", "68"});
    std::vector<std::string> cpu = {BinDir() + "/thermocline-cpu-worker"};
    cpu.insert(cpu.end(), placement.begin(), placement.end());
    gpu_worker = std::make_unique<Process>(gpu, absl::StrCat(dir, "/gpu", round, ".log"));
    cpu_worker = std::make_unique<Process>(cpu, absl::StrCat(dir, "/cpu", round, ".log"));
    gateway = std::make_unique<Process>(
        std::vector<std::string>{BinDir() + "/thermocline-gateway", "--workers", "attach",
                                 "--instance", name, "--model", m, "--hot-fraction", "0.5",
                                 "--context", "256", "--listen", "127.0.0.1:0",
                                 "--metrics-listen", "127.0.0.1:0"},
        absl::StrCat(dir, "/gateway", round, ".log"));
    address = Field(gateway->FirstLine(), "grpc");
    channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    stub = v1::Generation::NewStub(channel);
  }
  bool WaitServing() {
    auto health = grpc::health::v1::Health::NewStub(channel);
    for (int i = 0; i < 600; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      if (health->Check(&ctx, req, &resp).ok() &&
          resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  std::vector<int32_t> Generate() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->Generate(&ctx, Greedy("Once upon a time", 32));
    v1::GenerateResponse r;
    std::vector<int32_t> ids;
    while (reader->Read(&r)) {
      for (int32_t id : r.chunk().token_ids()) ids.push_back(id);
    }
    EXPECT_TRUE(reader->Finish().ok());
    return ids;
  }
  std::unique_ptr<Process> gpu_worker, cpu_worker, gateway;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Generation::Stub> stub;
};

TEST(DeployAttach, WorkersAsTheirOwnProcessesAndRecoveryByRestart) {
  const std::string name = absl::StrCat("attach-", getpid());
  std::vector<int32_t> first;
  {
    Instance a(name, 0);
    ASSERT_TRUE(a.WaitServing()) << a.gateway->Log();
    first = a.Generate();
    ASSERT_FALSE(first.empty());
    a.gpu_worker->Signal(SIGKILL);
    // The gateway cannot take a new worker in: it exits 1 for the service manager.
    const std::optional<int> st = a.gateway->Wait(30);
    ASSERT_TRUE(st.has_value()) << "the gateway kept running after its worker died";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << "status " << *st;
    EXPECT_NE(a.gateway->Log().find("a worker died and --workers attach cannot restart it"),
              std::string::npos)
        << a.gateway->Log();
    // The survivor sees its gateway gone and exits (its unit has Restart=always).
    EXPECT_TRUE(a.cpu_worker->Wait(30).has_value()) << a.cpu_worker->Log();
  }
  // What systemd's restarts produce: three fresh processes under the same name (the old
  // segments are stale and are replaced).
  Instance b(name, 1);
  ASSERT_TRUE(b.WaitServing()) << b.gateway->Log();
  EXPECT_EQ(b.Generate(), first);
  b.gateway->Signal(SIGTERM);
  const std::optional<int> st = b.gateway->Wait(30);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "status " << *st;
  EXPECT_TRUE(ipc::ListInstanceSegments(name).empty());
}

}  // namespace
}  // namespace thermocline::testing
