// Issue 7, item 4 (docs/operations.md, "Soak"): the real gateway on stories260K with
// --hot-fraction 0.5 under 64 concurrent client streams for THERMOCLINE_SOAK_SECONDS (default
// 45): greedy requests (checked token for token against a quiet run), sampled ones, random
// cancellations, malformed requests, and every 2-4 s one fault: kill -9 of a random worker,
// its compute thread frozen with ptrace (its heartbeat thread beating on: found by the
// --hang-timeout of 2 s), or the corrupt flag of a random ring set (the steps that meet it
// fail DATA_LOSS naming the ring, the only failure allowed; then every ring is reset). Beside
// them, streamed HTTP completions whose reader never reads (a socket with a 1 KiB receive
// buffer: the gateway's writes block once the kernel's buffers fill), which the gateway must
// pause, abandon after --stream-idle-timeout and free; gRPC readers announcing a zero window
// are python_slow_reader_test's (a gRPC client cannot be made to). Afterwards:
// the gateway is the same process and SERVING; every call ended with a complete stream or a
// clear status; KV slots, segments and file descriptors are back where they were; VmRSS grew
// by less than the stated margin. The figures are printed (and recorded in operations.md for
// the long run).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "shared/ipc/segment.h"
#include "tests/e2e/gateway_harness.h"
#include "tests/fault_injection.h"

namespace thermocline::testing {
namespace {

// Joins every thread of `threads` when it goes out of scope (or at Now()), first setting *stop
// when given: a std::thread destroyed unjoined would abort the whole test binary with nothing
// but "terminate called without an active exception".
class JoinAll {
 public:
  JoinAll(std::vector<std::thread>& threads, std::atomic<bool>* stop)
      : threads_(threads), stop_(stop) {}
  ~JoinAll() { Now(); }
  void Now() {
    if (stop_ != nullptr) stop_->store(true);
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::vector<std::thread>& threads_;
  std::atomic<bool>* stop_;
};

// The value of an unlabelled metric line "name value", or -1.
double Metric(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::atof(line.c_str() + name.size() + 1);
  }
  return -1;
}
// Sum of a labelled counter's lines "name{...} value".
double MetricSum(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string line;
  double sum = 0;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) == 0) sum += std::atof(line.c_str() + line.rfind(' ') + 1);
  }
  return sum;
}

// The contents of a /proc file, or "" when the process is gone. Processes exit while the test
// walks /proc (the chaos kills them), and a read then fails with ESRCH: libstdc++'s filebuf
// throws on that, so this reads with read(2).
std::string ReadProcFile(const std::string& path) {
  std::string out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// pids of the processes whose command line holds "--instance <instance>" and whose argv[0]
// ends with `exe`.
std::vector<pid_t> Pids(const std::string& instance, const std::string& exe) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    const std::string cmd = ReadProcFile(absl::StrCat("/proc/", pid, "/cmdline"));
    std::vector<std::string> args;
    for (size_t at = 0; at < cmd.size();) {
      const size_t end = cmd.find('\0', at);
      args.push_back(cmd.substr(at, end - at));
      at = end == std::string::npos ? cmd.size() : end + 1;
    }
    if (args.empty() || !absl::EndsWith(args[0], exe)) continue;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--instance" && args[i + 1] == instance) out.push_back(pid);
    }
  }
  closedir(d);
  return out;
}

int CountFds(pid_t pid) {
  int n = 0;
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// A field of /proc/PID/status ("VmRSS:" in KiB, "Threads:"), or -1.
int64_t ProcStatus(pid_t pid, const std::string& field) {
  std::istringstream in(ReadProcFile(absl::StrCat("/proc/", pid, "/status")));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atoll(line.c_str() + field.size());
  }
  return -1;
}
int64_t VmRssKiB(pid_t pid) { return ProcStatus(pid, "VmRSS:"); }
int64_t Threads(pid_t pid) { return ProcStatus(pid, "Threads:"); }

// Malformed requests: each must be refused with INVALID_ARGUMENT.
std::vector<v1::GenerateRequest> BadRequests(int context) {
  std::vector<v1::GenerateRequest> bad;
  auto add = [&](auto edit) {
    v1::GenerateRequest r = Greedy("Once upon a time", 8);
    edit(r);
    bad.push_back(r);
  };
  add([](v1::GenerateRequest& r) { r.set_temperature(-1); });
  add([](v1::GenerateRequest& r) { r.set_top_p(2); });
  add([](v1::GenerateRequest& r) { r.set_text(""); });
  // (Invalid UTF-8 in `text` cannot be sent: the client's proto3 serializer refuses it; the
  // validation fuzzer covers it.)
  add([](v1::GenerateRequest& r) { r.add_stop_token_ids(-7); });
  add([&](v1::GenerateRequest& r) { r.set_max_new_tokens(context * 4); });
  add([](v1::GenerateRequest& r) { r.set_max_new_tokens(-3); });
  add([](v1::GenerateRequest& r) { r.mutable_token_ids()->add_ids(1 << 30); });
  add([](v1::GenerateRequest& r) { r.set_top_logprobs(1000); r.set_logprobs(true); });
  add([](v1::GenerateRequest& r) { r.add_stop(std::string(4096, 'x')); });
  add([](v1::GenerateRequest& r) { r.set_repetition_penalty(-5); });
  return bad;
}

// A wedged instance is only understood from its logs and stacks: they are copied where the
// test's temporary directory does not delete them, with every thread's stack of each process
// when gdb is installed.
void KeepEvidence(const Gateway& gw, const std::string& workers_log, const std::string& instance) {
  const std::string dir = absl::StrCat(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                                       "/", instance, "-evidence");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/gateway.log") << gw.Log();
  std::error_code ec;
  std::filesystem::copy_file(workers_log, dir + "/workers.log",
                             std::filesystem::copy_options::overwrite_existing, ec);
  if (access("/usr/bin/gdb", X_OK) == 0) {
    std::vector<pid_t> pids = {gw.pid()};
    for (const char* exe : {"thermocline-gpu-worker", "thermocline-cpu-worker"}) {
      for (pid_t p : Pids(instance, exe)) pids.push_back(p);
    }
    for (pid_t p : pids) {
      const std::string cmd = absl::StrCat(
          "/usr/bin/gdb -batch -p ", p, " -ex 'thread apply all bt' > ", dir, "/stacks-", p,
          ".txt 2>&1");
      (void)!std::system(cmd.c_str());
    }
  }
  ADD_FAILURE() << "the instance did not come back; its logs and stacks are in " << dir;
}

TEST(Soak, ChaosUnder64StreamsLosesNothingAndLeaksNothing) {
  const char* env = std::getenv("THERMOCLINE_SOAK_SECONDS");
  const int seconds = env != nullptr ? std::max(10, std::atoi(env)) : 45;
  const std::string instance = absl::StrCat("soak-", getpid());
  const std::string workers_log = absl::StrCat(TempDir(), "/", instance, ".workers.log");
  auto gw = std::make_unique<Gateway>(
      instance, std::vector<std::string>{"--kv-slots", "8", "--max-batch", "8", "--max-queue",
                                         "128", "--max-restarts", "1000", "--hang-timeout", "2",
                                         "--http-listen", "127.0.0.1:0", "--stream-idle-timeout",
                                         "2",
                                         "--worker-log", workers_log});
  const std::vector<pid_t> gws = Pids(instance, "thermocline-gateway");
  ASSERT_EQ(gws.size(), 1u);
  const pid_t gateway = gws[0];

  // Quiet references for the greedy requests.
  const char* kPrompts[] = {"Once upon a time", "The little dog", "Lily wanted", "Tom and Sam",
                            "One day, a big", "The sun was"};
  std::vector<v1::GenerateRequest> greedy;
  std::vector<Completion> reference;
  for (int i = 0; i < 6; ++i) {
    greedy.push_back(Greedy(kPrompts[i], 24 + 12 * i));
    reference.push_back(gw->Generate(greedy.back()));
    ASSERT_TRUE(reference.back().status.ok()) << reference.back().status.error_message();
  }
  const std::vector<v1::GenerateRequest> bad = BadRequests(256);

  // Warm-up burst at full concurrency, so gRPC's and the allocator's high-water marks are
  // reached before the baseline is taken.
  {
    std::vector<std::thread> t;
    JoinAll join_warmup(t, nullptr);
    for (int i = 0; i < 64; ++i) t.emplace_back([&, i] { gw->Generate(greedy[i % 6]); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int fds_before = CountFds(gateway);
  const int64_t rss_before = VmRssKiB(gateway);
  const int64_t threads_before = Threads(gateway);
  const std::vector<std::string> segs = ipc::ListInstanceSegments(instance);
  ASSERT_GE(segs.size(), 2u);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> served{0}, greedy_ok{0}, sampled_ok{0}, cancelled{0}, refused{0},
      bad_tried{0}, unavailable{0}, kills{0}, freezes{0}, scribbles{0}, data_loss{0};
  std::mutex mu;
  std::vector<std::string> problems;
  auto problem = [&](std::string s) {
    std::lock_guard<std::mutex> l(mu);
    if (problems.size() < 20) problems.push_back(std::move(s));
  };

  std::vector<std::thread> clients;
  // Whatever leaves this scope (an exception while starting threads, a failed assertion), the
  // clients are stopped and joined first, so it is reported instead of aborting the process.
  JoinAll join_clients(clients, &stop);
  for (int c = 0; c < 64; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(1234 + c);
      while (!stop.load()) {
        const int dice = static_cast<int>(rng() % 100);
        if (dice < 10) {  // malformed
          const v1::GenerateRequest& r = bad[rng() % bad.size()];
          ++bad_tried;
          const Completion got = gw->Generate(r);
          if (got.status.error_code() != grpc::StatusCode::INVALID_ARGUMENT ||
              got.status.error_message().empty()) {
            problem(absl::StrCat("malformed request got ", got.status.error_code(), " ",
                                 got.status.error_message()));
          }
          continue;
        }
        const size_t k = rng() % greedy.size();
        const bool sampled = dice < 25;
        v1::GenerateRequest r = greedy[k];
        if (sampled) {
          r.set_temperature(0.9f);
          r.set_seed(rng() % 1000 + 1);
        }
        const bool cancel = dice >= 85;
        const int cancel_after = 1 + static_cast<int>(rng() % 6);
        const Completion got = gw->Generate(
            r, [](grpc::ClientContext& ctx) {
              ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
            },
            [&](grpc::ClientContext& ctx, int chunks) {
              if (cancel && chunks == cancel_after) ctx.TryCancel();
            });
        const grpc::StatusCode code = got.status.error_code();
        if (got.status.ok()) {
          ++served;
          if (got.final.finish_reason() == v1::FINISH_REASON_UNSPECIFIED) {
            problem("a stream ended OK without a finish reason");
          }
          if (sampled) {
            ++sampled_ok;
          } else {
            ++greedy_ok;
            if (got.ids != reference[k].ids || got.text != reference[k].text) {
              problem(absl::StrCat("greedy request ", k, " differs from the quiet run"));
            }
          }
        } else if (code == grpc::StatusCode::CANCELLED && cancel) {
          ++cancelled;
        } else if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++refused;  // the queue was full: a clear status, not a loss
        } else if (code == grpc::StatusCode::DATA_LOSS &&
                   got.status.error_message().find("ring ") != std::string::npos) {
          ++data_loss;  // a scribbled ring: its step's output could not be trusted
        } else {
          ++unavailable;
          problem(absl::StrCat("request ended with ", code, ": ", got.status.error_message()));
        }
      }
    });
  }

  // Never-read streams: every 1-2 s one more streamed completion (2 sequences, 5 logprobs:
  // ~0.7 MB of SSE) whose socket is never read, held open for 6-10 s (past the idle timeout,
  // queueing included) and then closed; at most 3 at a time.
  std::atomic<int64_t> never_read{0};
  clients.emplace_back([&] {
    std::mt19937 rng(4321);
    const std::string& http = gw->http_address();
    const size_t colon = http.rfind(':');
    const int port = std::atoi(http.c_str() + colon + 1);
    std::deque<std::pair<int, std::chrono::steady_clock::time_point>> open;
    while (!stop.load()) {
      const auto now = std::chrono::steady_clock::now();
      while (!open.empty() && (open.front().second <= now || stop.load())) {
        close(open.front().first);
        open.pop_front();
      }
      if (open.size() < 3) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        const int rcvbuf = 4096;  // before connect: it sets the window
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(static_cast<uint16_t>(port));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
          problem(absl::StrCat("cannot connect to the HTTP API at ", http));
          close(fd);
        } else {
          const std::string body =
              R"({"prompt":"Once upon a time","max_tokens":240,"ignore_eos":true,"stream":true,)"
              R"("logprobs":5,"n":2})";
          const std::string req = absl::StrCat(
              "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
              "application/json\r\nContent-Length: ",
              body.size(), "\r\n\r\n", body);
          if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
            problem("could not send a never-read request");
          }
          ++never_read;
          open.emplace_back(fd, now + std::chrono::milliseconds(6000 + rng() % 4000));
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1000 + rng() % 1000));
    }
    for (auto& [fd, when] : open) close(fd);
  });

  // Chaos: one fault every 2-4 s; segments checked at every tick.
  std::mt19937 rng(99);
  std::vector<pid_t> tracers;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000 + rng() % 2000));
    const int fault = static_cast<int>(rng() % 100);
    const char* exe = rng() % 2 ? "thermocline-gpu-worker" : "thermocline-cpu-worker";
    if (fault < 55) {
      for (pid_t p : Pids(instance, exe)) {
        if (kill(p, SIGKILL) == 0) ++kills;
      }
    } else if (fault < 85) {
      for (pid_t p : Pids(instance, exe)) {
        const pid_t tracer = FreezeThread(p);  // its main thread: the compute loop
        if (tracer > 0) {
          tracers.push_back(tracer);
          ++freezes;
        }
      }
    } else {
      MappedTransport shm(instance);
      if (shm.ok()) {
        shm.Ring(static_cast<ipc::RingId>(rng() % ipc::kNumRings)).corrupt.store(1);
        ++scribbles;
      }
    }
    const std::vector<std::string> now = ipc::ListInstanceSegments(instance);
    EXPECT_EQ(std::set<std::string>(now.begin(), now.end()),
              std::set<std::string>(segs.begin(), segs.end()));
  }
  join_clients.Now();
  // Every frozen worker was found hung and killed while frozen (its tracer then exits 0).
  for (pid_t t : tracers) EXPECT_EQ(ReapTracer(t), 0) << "a frozen worker was never replaced";

  // Afterwards: same gateway, SERVING, nothing held.
  EXPECT_EQ(kill(gateway, 0), 0) << "the gateway died";
  EXPECT_EQ(Pids(instance, "thermocline-gateway"), std::vector<pid_t>{gateway});
  const bool serving = gw->WaitServing(true);
  EXPECT_TRUE(serving);
  if (!serving) KeepEvidence(*gw, workers_log, instance);
  double slots = -1;
  std::string metrics;
  for (int i = 0; i < 100 && slots != 0; ++i) {
    metrics = ScrapeMetrics(gw->metrics_address());
    slots = Metric(metrics, "thermocline_kv_slots_used");
    if (slots != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(slots, 0) << "KV slots still held";
  const double restarts = MetricSum(metrics, "thermocline_worker_restarts_total");
  // The never-read streams the gateway gave up (the others ended within the kernel's buffers
  // or when their socket closed).
  int64_t abandoned = 0;
  {
    std::istringstream lines(gw->Log());
    std::string line;
    while (std::getline(lines, line)) abandoned += line.find("event=stream_abandoned") != std::string::npos;
  }
  EXPECT_GT(never_read.load(), 0);
  EXPECT_GT(abandoned, 0) << "no never-read HTTP stream was paused and ended";
  // One more request after the chaos: the gateway still computes the same answer.
  const Completion last = gw->Generate(greedy[0]);
  EXPECT_TRUE(last.status.ok());
  EXPECT_EQ(last.ids, reference[0].ids);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int fds_after = CountFds(gateway);
  const int64_t rss_after = VmRssKiB(gateway);
  const int64_t threads_after = Threads(gateway);
  // gRPC may keep a few more sockets or pipes than at the baseline; a leak per request or per
  // restart would be hundreds here.
  EXPECT_LE(fds_after, fds_before + 8) << "fd leak";
  // Memory flat: at most 64 MiB more than after the warm-up burst.
  EXPECT_LE(rss_after - rss_before, 64 * 1024) << "VmRSS grew";
  // Threads flat: gRPC's and the HTTP API's pools are sized at start; a thread per stream or
  // per restart left behind would show here.
  EXPECT_LE(threads_after, threads_before + 4) << "threads grew";
  const std::vector<std::string> segs_after = ipc::ListInstanceSegments(instance);
  EXPECT_EQ(std::set<std::string>(segs_after.begin(), segs_after.end()),
            std::set<std::string>(segs.begin(), segs.end()));
  for (const std::string& p : problems) ADD_FAILURE() << p;
  EXPECT_GT(kills.load(), 0);
  EXPECT_GT(greedy_ok.load(), 0);

  const std::string figures = absl::StrCat(
      "soak: ", seconds, " s, 64 streams: served ", served.load(), " (greedy ", greedy_ok.load(),
      " all equal to the quiet run, sampled ", sampled_ok.load(), "), cancelled ",
      cancelled.load(), ", queue-full refusals ", refused.load(), ", malformed tried ",
      bad_tried.load(), " (all INVALID_ARGUMENT), worker kills ", kills.load(),
      ", compute threads frozen ", freezes.load(), ", rings scribbled ", scribbles.load(),
      " (DATA_LOSS answers ", data_loss.load(), ")",
      ", restarts survived ", restarts, ", other failures ", unavailable.load(),
      ", never-read HTTP streams ", never_read.load(), " (abandoned by the gateway ",
      abandoned, ")",
      "; gateway fds ", fds_before, " -> ", fds_after, ", threads ", threads_before, " -> ",
      threads_after, ", VmRSS ", rss_before, " -> ", rss_after,
      " KiB; KV slots used after: ", slots);
  std::cout << figures << std::endl;
  RecordProperty("figures", figures);

  gw.reset();  // SIGTERM: a clean exit removes every segment of the instance
  const std::vector<std::string> left = ipc::ListInstanceSegments(instance);
  EXPECT_TRUE(left.empty()) << left.size() << " segments left, e.g. " << left.front();
}

}  // namespace
}  // namespace thermocline::testing
