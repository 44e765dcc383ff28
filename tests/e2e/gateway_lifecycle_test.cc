// The gateway's edges in time: a shutdown with streams in flight, a deadline that passes in the
// queue. Real gateway processes, real gRPC clients.
#include <signal.h>

#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "shared/ipc/segment.h"
#include "tests/e2e/gateway_harness.h"

namespace thermocline::testing {
namespace {

std::string Unique(const std::string& name) { return absl::StrCat("e2e-", name, "-", getpid()); }

// A request that only the server can end early (ignore_eos, nearly the whole context).
v1::GenerateRequest Long() {
  v1::GenerateRequest r = Greedy("Once upon a time", 2000);
  r.set_ignore_eos(true);
  return r;
}

pid_t GpuWorkerPid(const Gateway& gw) {
  int pid = 0;
  EXPECT_TRUE(absl::SimpleAtoi(gw.LogValue("workers_ready", "gpu_pid"), &pid)) << gw.Log();
  return pid;
}

// SIGTERM with a stream running and one queued: the running one gets the Final the proto
// promises (FINISH_REASON_CANCELLED, status OK, every token streamed counted), the queued one
// UNAVAILABLE, and the gateway exits 0. The gpu worker is stopped (SIGSTOP) while the request is
// admitted, so the stream is certainly in flight when the signal comes, whatever the machine's
// speed; it is let go once the gateway has logged the shutdown.
TEST(GatewayLifecycle, ShutdownEndsInFlightStreamsWithACancelledFinal) {
  Gateway gw(Unique("shutdown"), {"--shutdown-grace", "0", "--context", "2048", "--max-batch",
                                  "1", "--kv-slots", "1", "--max-queue", "4"});
  const pid_t gpu = GpuWorkerPid(gw);
  ASSERT_GT(gpu, 0);
  ASSERT_EQ(kill(gpu, SIGSTOP), 0);
  Completion running, queued;
  std::thread tr([&] { running = gw.Generate(Long()); });
  ASSERT_TRUE(Gateway::WaitFor([&] { return gw.Metric("thermocline_kv_slots_used") == 1; }));
  std::thread tq([&] { queued = gw.Generate(Greedy("The little dog", 8)); });
  ASSERT_TRUE(Gateway::WaitFor([&] { return gw.Metric("thermocline_requests_waiting") == 1; }));
  gw.Signal(SIGTERM);
  ASSERT_TRUE(Gateway::WaitFor([&] { return !gw.LogValue("shutdown", "signal").empty(); }));
  ASSERT_EQ(kill(gpu, SIGCONT), 0);
  tr.join();
  tq.join();
  ASSERT_TRUE(running.status.ok()) << running.status.error_message() << "\n" << gw.Log();
  EXPECT_EQ(running.final.finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_LT(running.ids.size(), 2000u);
  EXPECT_EQ(running.final.usage().completion_tokens(), static_cast<int>(running.ids.size()));
  EXPECT_EQ(queued.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << queued.status.error_message();
  EXPECT_NE(queued.status.error_message().find("shutting down"), std::string::npos);
  const std::optional<int> status = gw.WaitExit(60);
  ASSERT_TRUE(status.has_value()) << "the gateway did not exit";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status << "\n" << gw.Log();
}

// A request whose deadline passes while it waits for the only slot is logged and counted as
// DEADLINE_EXCEEDED (not as cancelled by its caller), as the caller sees it.
TEST(GatewayLifecycle, DeadlinePassedInTheQueueIsLoggedAsDeadlineExceeded) {
  Gateway gw(Unique("deadline-log"), {"--max-batch", "1", "--kv-slots", "1", "--max-queue", "4",
                                      "--context", "2048"});
  grpc::ClientContext a_ctx;
  auto a_reader = gw.stub().Generate(&a_ctx, Long());
  v1::GenerateResponse first;
  ASSERT_TRUE(a_reader->Read(&first));  // A holds the only slot until it is cancelled below
  v1::GenerateRequest b = Greedy("The little dog", 8);
  b.set_request_id("queued-b");
  const Completion got = gw.Generate(b, [](grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  });
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The scheduler drops B at its next step boundary, after the handler returned.
  ASSERT_TRUE(Gateway::WaitFor([&] { return !gw.LogValue("request_failed", "code").empty(); }))
      << gw.Log();
  EXPECT_EQ(gw.LogValue("request_failed", "request_id"), "queued-b");
  EXPECT_EQ(gw.LogValue("request_failed", "code"), "DEADLINE_EXCEEDED") << gw.Log();
  EXPECT_NE(ScrapeMetrics(gw.metrics_address())
                .find("thermocline_requests_total{outcome=\"deadline_exceeded\"} 1"),
            std::string::npos);
  a_ctx.TryCancel();
  while (a_reader->Read(&first)) {}
  EXPECT_EQ(a_reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// A worker that keeps dying spends its restart budget (here 0: the first death spends it,
// which makes the test independent of how fast restarts are). The gateway does not stay up
// idle and NOT_SERVING for requests that a health-aware load balancer never sends: it exits
// with status 1, naming the worker, for its service manager to restart the whole instance.
// The death happens while idle, so it is the gateway's own probe that finds it.
TEST(GatewayLifecycle, SpentRestartBudgetEndsTheGatewayWithStatus1) {
  Gateway gw(Unique("budget"), {"--max-restarts", "0"});
  const Completion before = gw.Generate(Greedy("Once upon a time", 8));
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();
  const pid_t gpu = GpuWorkerPid(gw);
  ASSERT_GT(gpu, 0);
  ASSERT_EQ(kill(gpu, SIGKILL), 0);
  const std::optional<int> status = gw.WaitExit(60);
  ASSERT_TRUE(status.has_value()) << "the gateway stayed up after its budget was spent:\n"
                                  << gw.Log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << *status;
  const std::string log = gw.Log();
  EXPECT_NE(log.find("event=giving_up"), std::string::npos) << log;
  EXPECT_NE(log.find("gpu_worker"), std::string::npos);
  EXPECT_NE(log.find("keeps dying"), std::string::npos) << log;
  EXPECT_NE(log.find("restart budget"), std::string::npos) << log;
  // The workers went with it and the instance's segments were removed on the way out.
  EXPECT_TRUE(Gateway::WaitFor([&] { return kill(gpu, 0) != 0; }));
  EXPECT_TRUE(ipc::ListInstanceSegments(Unique("budget")).empty());
}

// The unit's journal holds one format: every line the gateway, its two workers and the driver
// write to their shared stderr is logfmt (shared/util/logfmt.h), through a worker restart and a
// shutdown — the events where the workers and the driver speak. The regex is logfmt's grammar
// as the writer promises it: ts (absent only on the SIGBUS line), level, component, event, then
// key=value pairs whose values are bare or double-quoted with backslash escapes.
TEST(GatewayLifecycle, EveryLineOfTheUnitsStderrIsLogfmt) {
  std::optional<Gateway> gw(std::in_place, Unique("logfmt"), std::vector<std::string>{});
  ASSERT_TRUE(gw->Generate(Greedy("Once upon a time", 8)).status.ok()) << gw->Log();
  int cpu = 0;
  ASSERT_TRUE(absl::SimpleAtoi(gw->LogValue("workers_ready", "cpu_pid"), &cpu)) << gw->Log();
  ASSERT_EQ(kill(cpu, SIGKILL), 0);
  const Completion after = gw->Generate(Greedy("Once upon a time", 8));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message() << "\n" << gw->Log();
  gw->Signal(SIGTERM);
  ASSERT_TRUE(gw->WaitExit(60).has_value()) << gw->Log();
  const std::string log = gw->Log();
  gw.reset();
  const std::regex line_re(
      "(ts=[0-9T:.Z-]+ )?level=(debug|info|warn|error) component=[a-z_]+ event=[a-z_]+"
      "( [a-z_]+=([^ \"=\\\\]+|\"([^\"\\\\]|\\\\.)*\"))*");
  std::istringstream lines(log);
  std::string line;
  std::set<std::string> components;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    EXPECT_TRUE(std::regex_match(line, line_re)) << "not logfmt: " << line;
    const size_t at = line.find(" component=");
    if (at != std::string::npos) {
      components.insert(line.substr(at + 11, line.find(' ', at + 11) - at - 11));
    }
  }
  EXPECT_GT(n, 8) << log;
  for (const char* c : {"gateway", "gpu_worker", "cpu_worker", "driver"}) {
    EXPECT_TRUE(components.count(c)) << "no line from " << c << " in:\n" << log;
  }
  // The worker lines carry what the old sentences did, as fields.
  EXPECT_NE(log.find("component=cpu_worker event=attached instance="), std::string::npos) << log;
  EXPECT_NE(log.find("component=driver event=worker_restarted"), std::string::npos) << log;
}

// --max-concurrent bounds the Generate calls in flight, whatever holds them (here a request the
// stopped gpu worker cannot finish): one more is refused at once with RESOURCE_EXHAUSTED naming
// the flag, and once the first ends, calls are served again.
TEST(GatewayLifecycle, MaxConcurrentRefusesCallsBeyondIt) {
  Gateway gw(Unique("max-concurrent"), {"--max-concurrent", "1"});
  const pid_t gpu = GpuWorkerPid(gw);
  ASSERT_GT(gpu, 0);
  ASSERT_EQ(kill(gpu, SIGSTOP), 0);
  Completion first;
  std::thread t([&] { first = gw.Generate(Greedy("Once upon a time", 8)); });
  ASSERT_TRUE(Gateway::WaitFor([&] { return gw.Metric("thermocline_kv_slots_used") == 1; }));
  const Completion refused = gw.Generate(Greedy("The little dog", 8));
  ASSERT_EQ(kill(gpu, SIGCONT), 0);
  t.join();
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_message();
  EXPECT_NE(refused.status.error_message().find("--max-concurrent"), std::string::npos)
      << refused.status.error_message();
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  const Completion again = gw.Generate(Greedy("The little dog", 8));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
}

// A TCP connection to `address` ("HOST:PORT") that sends nothing; -1 on failure.
int IdleConnection(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// 16 connections that never send a byte do not hold up a scrape: it is answered while every
// one of them is still open (a server that made the scrape wait would first have had to time
// some of them out and close them).
TEST(GatewayLifecycle, IdleConnectionsDoNotStarveMetrics) {
  Gateway gw(Unique("idle-metrics"));
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) {
    idle.push_back(IdleConnection(gw.metrics_address()));
    ASSERT_GE(idle.back(), 0);
  }
  const std::string scrape = ScrapeMetrics(gw.metrics_address());
  EXPECT_NE(scrape.find("thermocline_kv_slots_total"), std::string::npos) << scrape;
  int still_open = 0;
  for (int fd : idle) {
    char c;
    // Nothing to read and not closed by the server: -1 with EAGAIN (0 would be its close).
    if (recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK) < 0 && errno == EAGAIN) ++still_open;
    close(fd);
  }
  EXPECT_EQ(still_open, 16);
}

}  // namespace
}  // namespace thermocline::testing
