// kill -9 of a worker in the middle of several streams: every stream completes with the output
// of an undisturbed run, each token exactly once; health goes NOT_SERVING then SERVING; the
// restart shows in /metrics.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/e2e/gateway_harness.h"

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

  const std::string pid_text = gw.LogValue("workers_ready", role == "gpu_worker" ? "gpu_pid" : "cpu_pid");
  pid_t pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(pid_text, &pid)) << gw.Log();
  ASSERT_GT(pid, 0);

  std::vector<Completion> got(reqs.size());
  std::vector<std::thread> threads;
  std::atomic<bool> killed{false};
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      got[i] = gw.Generate(reqs[i], {}, [&](grpc::ClientContext&, int n) {
        // Mid-stream: every stream has started (stream 0 is 20 tokens in).
        if (i == 0 && n == 20 && !killed.exchange(true)) kill(pid, SIGKILL);
      });
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(killed.load());
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

TEST(GatewayRecovery, KillGpuWorkerMidStreams) { KillWorkerMidStreams("gpu_worker"); }
TEST(GatewayRecovery, KillCpuWorkerMidStreams) { KillWorkerMidStreams("cpu_worker"); }

}  // namespace
}  // namespace thermocline::testing
