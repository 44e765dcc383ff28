// The e2e tests' gateway: a real thermocline-gateway process (posix_spawn, no shell) on free
// ports, its stdout's "listening grpc=... metrics=..." line parsed for the address, its stderr
// kept in a file (the workers' pids are read from its workers_ready line), and a gRPC channel
// with the generated stubs. SIGTERM and reaping at the end; SIGKILL if it does not exit.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/process_spawn.h"
#include "tests/test_support.h"
#include "thermocline/v1/generation.grpc.pb.h"

namespace thermocline::testing {

inline std::string Stories260K() { return ModelPath("stories260K/stories260K.gguf"); }

// What one Generate call returned, token by token.
struct Completion {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;  // every chunk's text + Final.text
  v1::Final final;
  int chunks = 0;
};

class Gateway {
 public:
  // Starts the gateway on stories260K (or `model`) with --hot-fraction 0.5 (none with
  // `placement` false: the gateway's default) and `extra` flags; waits for the listening line
  // and then for health SERVING.
  explicit Gateway(const std::string& instance, std::vector<std::string> extra = {},
                   bool placement = true, const std::string& model = "") {
    log_path_ = absl::StrCat(TempDir(), "/", instance, ".log");
    std::vector<std::string> argv = {absl::StrCat(BinDir(), "/thermocline-gateway"),
                                     "--model", model.empty() ? Stories260K() : model,
                                     "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                     "--instance", instance};
    if (placement) argv.insert(argv.end(), {"--hot-fraction", "0.5"});
    // A small context keeps the KV caches small; tests that need more pass their own.
    if (std::find(extra.begin(), extra.end(), "--context") == extra.end()) {
      extra.insert(extra.end(), {"--context", "256"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto child = SpawnProcess(argv, {.stdout_pipe = true, .stderr_file = log_path_});
    if (!child.ok()) {
      ADD_FAILURE() << child.status();
      return;
    }
    pid_ = child->pid;
    // The first stdout line: "listening grpc=HOST:PORT metrics=HOST:PORT".
    std::string line;
    char c;
    while (read(child->stdout_fd, &c, 1) == 1 && c != '\n') line.push_back(c);
    close(child->stdout_fd);
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      if (w.rfind("grpc=", 0) == 0) address_ = w.substr(5);
      if (w.rfind("metrics=", 0) == 0) metrics_address_ = w.substr(8);
      if (w.rfind("http=", 0) == 0 && w != "http=off") http_address_ = w.substr(5);
    }
    if (address_.empty()) {
      ADD_FAILURE() << "no listening line; got '" << line << "'; log:\n" << Log();
      return;
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(8 << 20);
    channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Generation::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
    if (!WaitServing(true)) ADD_FAILURE() << "never SERVING; log:\n" << Log();
  }

  ~Gateway() {
    if (pid_ <= 0 || exited_) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {  // 20 s
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "the gateway did not exit on SIGTERM; killing it";
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  pid_t pid() const { return pid_; }
  void Signal(int sig) { kill(pid_, sig); }
  // Waits (at most `seconds`, a safety net) for the gateway to exit by itself; its wait status.
  std::optional<int> WaitExit(int seconds) {
    for (int i = 0; i < seconds * 100; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }
  // Polls `done` every 10 ms for at most 60 s (a safety net); whether it became true.
  static bool WaitFor(const std::function<bool()>& done) {
    for (int i = 0; i < 6000; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // The value of an unlabelled metric in a /metrics scrape (NaN when absent).
  double Metric(const std::string& name) const;

  v1::Generation::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  // The OpenAI HTTP API's HOST:PORT (given --http-listen), else empty.
  const std::string& http_address() const { return http_address_; }
  std::string Log() const { return ReadFileOrDie(log_path_); }

  grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& service = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = health_->Check(&ctx, req, &resp);
    return s.ok() ? resp.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  // Polls until health (overall) is SERVING (true) or NOT_SERVING (false); 30 s at most.
  bool WaitServing(bool serving) {
    const auto want = serving ? grpc::health::v1::HealthCheckResponse::SERVING
                              : grpc::health::v1::HealthCheckResponse::NOT_SERVING;
    for (int i = 0; i < 3000; ++i) {
      if (Health() == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // The value of `key=` in the gateway's log line of `event` (first occurrence).
  std::string LogValue(const std::string& event, const std::string& key) const {
    std::istringstream lines(Log());
    std::string line;
    while (std::getline(lines, line)) {
      if (line.find(absl::StrCat("event=", event)) == std::string::npos) continue;
      const size_t at = line.find(absl::StrCat(" ", key, "="));
      if (at == std::string::npos) continue;
      const size_t begin = at + key.size() + 2;
      return line.substr(begin, line.find(' ', begin) - begin);
    }
    return "";
  }

  // Runs one Generate call to the end. `context_setup` may set a deadline; `on_chunk` is
  // called after each chunk with the number of chunks so far.
  Completion Generate(const v1::GenerateRequest& req,
                      const std::function<void(grpc::ClientContext&)>& context_setup = {},
                      const std::function<void(grpc::ClientContext&, int)>& on_chunk = {}) {
    grpc::ClientContext ctx;
    if (context_setup) context_setup(ctx);
    return ReadAll(ctx, stub_->Generate(&ctx, req), on_chunk);
  }
  // The same for one Chat call.
  Completion Chat(const v1::ChatRequest& req) {
    grpc::ClientContext ctx;
    return ReadAll(ctx, stub_->Chat(&ctx, req), {});
  }

 private:
  static Completion ReadAll(grpc::ClientContext& ctx,
                            std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader,
                            const std::function<void(grpc::ClientContext&, int)>& on_chunk) {
    Completion c;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      if (resp.has_chunk()) {
        for (int32_t id : resp.chunk().token_ids()) c.ids.push_back(id);
        c.text += resp.chunk().text();
        ++c.chunks;
        if (on_chunk) on_chunk(ctx, c.chunks);
      } else if (resp.has_final()) {
        c.final = resp.final();
        c.text += resp.final().text();
      }
    }
    c.status = reader->Finish();
    return c;
  }

  pid_t pid_ = -1;
  bool exited_ = false;
  std::string log_path_;
  std::string address_, metrics_address_, http_address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

// GET /metrics from a gateway's metrics address ("HOST:PORT") over a plain socket: HTTP/1.0,
// so the server closes after the reply. The whole response (headers included); "" when the
// address is bad.
inline std::string ScrapeMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

inline double Gateway::Metric(const std::string& name) const {
  std::istringstream lines(ScrapeMetrics(metrics_address_));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return std::nan("");
}

// The worker whose pid is `pid_key` (gpu_pid / cpu_pid) of the gateway's workers_ready line,
// SIGKILLed while every request streams: the requests run concurrently and the kill lands when
// stream 0 has received `at_token` tokens (the others have started by then). The completions,
// in request order; `*killed` says whether the kill happened at all.
inline std::vector<Completion> GenerateKillingWorker(Gateway& gw,
                                                     const std::vector<v1::GenerateRequest>& reqs,
                                                     const std::string& pid_key, bool* killed,
                                                     int at_token = 20) {
  *killed = false;
  pid_t pid = 0;
  if (!absl::SimpleAtoi(gw.LogValue("workers_ready", pid_key), &pid) || pid <= 0) {
    ADD_FAILURE() << "no " << pid_key << " in workers_ready; log:\n" << gw.Log();
    return {};
  }
  std::vector<Completion> got(reqs.size());
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      got[i] = gw.Generate(reqs[i], {}, [&](grpc::ClientContext&, int n) {
        if (i == 0 && n == at_token && !done.exchange(true)) kill(pid, SIGKILL);
      });
    });
  }
  for (auto& t : threads) t.join();
  *killed = done.load();
  return got;
}

// A greedy request for `prompt` and `n` tokens.
inline v1::GenerateRequest Greedy(const std::string& prompt, int n) {
  v1::GenerateRequest r;
  r.set_text(prompt);
  r.set_max_new_tokens(n);
  r.set_temperature(0);
  return r;
}

}  // namespace thermocline::testing
