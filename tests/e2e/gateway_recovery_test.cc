// kill -9 of a worker in the middle of several streams: every stream completes with the output
// of an undisturbed run, each token exactly once; health goes NOT_SERVING then SERVING; the
// restart shows in /metrics. A ring scribbled from outside: the request that meets it fails
// with DATA_LOSS naming the ring, and the instance recovers for the next ones.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>

#include <atomic>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "shared/ipc/transport.h"
#include "tests/e2e/gateway_harness.h"
#include "tests/fault_injection.h"

namespace thermocline::testing {
namespace {

void KillWorkerMidStreams(const std::string& role) {
  Gateway gw(absl::StrCat("e2e-kill-", role, "-", getpid()), {"--max-batch", "4"});
  const char* kPrompts[] = {"Once upon a time", "The little dog", "Lily wanted"};
  std::vector<v1::GenerateRequest> reqs;
  for (const char* p : kPrompts) {
    v1::GenerateRequest r = Greedy(p, 160);
    r.set_ignore_eos(true);
    reqs.push_back(r);
  }
  std::vector<Completion> undisturbed;
  for (const auto& r : reqs) undisturbed.push_back(gw.Generate(r));

  bool killed = false;
  const std::vector<Completion> got = GenerateKillingWorker(
      gw, reqs, role == "gpu_worker" ? "gpu_pid" : "cpu_pid", &killed);
  ASSERT_TRUE(killed);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(kPrompts[i]);
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, undisturbed[i].ids);  // every token exactly once, none lost
    EXPECT_EQ(got[i].text, undisturbed[i].text);
    EXPECT_EQ(got[i].chunks, static_cast<int>(got[i].ids.size()));
  }
  // Health went down during the recovery and is back up.
  EXPECT_TRUE(gw.WaitServing(true));
  const std::string log = gw.Log();
  const size_t down = log.find("event=not_serving");
  ASSERT_NE(down, std::string::npos) << log;
  EXPECT_NE(log.find("event=serving", down), std::string::npos) << log;
  // The restart is counted in /metrics.
  const std::string metrics = ScrapeMetrics(gw.metrics_address());
  bool counted = false;
  std::istringstream lines(metrics);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("thermocline_worker_restarts_total", 0) == 0 &&
        line.find(role) != std::string::npos && line.back() != '0') {
      counted = true;
    }
  }
  EXPECT_TRUE(counted) << metrics;
  // And the gateway serves new requests.
  const Completion after = gw.Generate(reqs[0]);
  EXPECT_EQ(after.ids, undisturbed[0].ids);
}

int64_t Restarts(const std::string& metrics, const std::string& role) {
  std::istringstream lines(metrics);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("thermocline_worker_restarts_total", 0) == 0 &&
        line.find(role) != std::string::npos) {
      return std::stoll(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

// A stray write over a live header of gpu->gateway: the gpu worker is stopped (SIGSTOP) while
// the garbage is published, so the gateway is certain to read the garbage rather than a record
// the worker wrote over it. That request fails with DATA_LOSS naming the ring; the corrupt mark
// it leaves in shared memory would kill every worker started onto it, so the next request
// finds both workers replaced and every ring reset under a new epoch, and gets the undisturbed
// output. Then the 4-byte corrupt flag of gpu->cpu set while idle: noticed before anything is
// sent, it costs the next request nothing but the restart.
TEST(GatewayRecovery, CorruptRingIsDataLossNamingItThenTheInstanceRecovers) {
  const std::string instance = absl::StrCat("e2e-corrupt-", getpid());
  Gateway gw(instance);
  const v1::GenerateRequest req = Greedy("Once upon a time", 24);
  const Completion undisturbed = gw.Generate(req);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();
  MappedTransport shm(instance);
  ASSERT_TRUE(shm.ok());
  pid_t gpu = 0;
  ASSERT_TRUE(absl::SimpleAtoi(gw.LogValue("workers_ready", "gpu_pid"), &gpu)) << gw.Log();

  ASSERT_EQ(kill(gpu, SIGSTOP), 0);
  shm.PublishGarbageHeader(ipc::RingId::kGpuToGateway);
  const Completion hit = gw.Generate(req);
  ASSERT_EQ(kill(gpu, SIGCONT), 0);
  EXPECT_EQ(hit.status.error_code(), grpc::StatusCode::DATA_LOSS) << hit.status.error_message();
  EXPECT_NE(hit.status.error_message().find("gpu->gateway"), std::string::npos)
      << hit.status.error_message();
  EXPECT_TRUE(hit.ids.empty());

  const Completion after = gw.Generate(req);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message() << "\n" << gw.Log();
  EXPECT_EQ(after.ids, undisturbed.ids);
  EXPECT_EQ(after.text, undisturbed.text);
  const std::string metrics = ScrapeMetrics(gw.metrics_address());
  EXPECT_GE(Restarts(metrics, "gpu_worker"), 1) << metrics;
  EXPECT_GE(Restarts(metrics, "cpu_worker"), 1) << metrics;
  for (int r = 0; r < ipc::kNumRings; ++r) {
    EXPECT_EQ(shm.Ring(static_cast<ipc::RingId>(r)).corrupt.load(), 0u) << "ring " << r;
  }

  shm.Ring(ipc::RingId::kGpuToCpu).corrupt.store(1);
  const Completion flagged = gw.Generate(req);
  ASSERT_TRUE(flagged.status.ok()) << flagged.status.error_message() << "\n" << gw.Log();
  EXPECT_EQ(flagged.ids, undisturbed.ids);
  EXPECT_NE(gw.Log().find("ring gpu->cpu is marked corrupt"), std::string::npos) << gw.Log();
  EXPECT_TRUE(gw.WaitServing(true));
}

TEST(GatewayRecovery, KillGpuWorkerMidStreams) { KillWorkerMidStreams("gpu_worker"); }
TEST(GatewayRecovery, KillCpuWorkerMidStreams) { KillWorkerMidStreams("cpu_worker"); }

}  // namespace
}  // namespace thermocline::testing
