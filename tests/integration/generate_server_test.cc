// `thermocline generate --server` against the real thermocline-gateway (which spawns the real
// workers) on stories260K: greedy output through the gateway equals local generation byte for
// byte; a stop string ends the text right before it (the local text cut at the same place);
// logprobs are printed; a bad request and an unreachable server exit 1 naming the status code.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/process_spawn.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

std::string Stories() { return testing::ModelPath("stories260K/stories260K.gguf"); }

// The gateway for the whole test binary: started once on port 0; its "listening" line gives the
// gRPC address. Stopped with SIGTERM at exit.
class Gateway {
 public:
  static Gateway& Get() {
    static Gateway* g = new Gateway();
    return *g;
  }
  const std::string& address() const { return address_; }
  const std::string& log() const { return log_; }

  ~Gateway() { Stop(); }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

 private:
  Gateway() {
    log_ = testing::TempDir() + "/gateway.log";
    std::vector<std::string> args = {
        testing::BinDir() + "/thermocline-gateway", "--model", Stories(), "--hot-fraction", "0.5",
        "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--instance",
        absl::StrCat("gstest-", getpid())};
    auto child = testing::SpawnProcess(
        args, {.stdout_pipe = true, .stderr_file = log_, .stderr_append = true});
    if (!child.ok()) {
      ADD_FAILURE() << child.status();
      return;
    }
    pid_ = child->pid;
    // The first stdout line: "listening grpc=127.0.0.1:PORT metrics=127.0.0.1:PORT" (EOF if the
    // gateway fails to start; the tests then report its log).
    FILE* f = fdopen(child->stdout_fd, "r");
    char line[512];
    if (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
      const std::string s(line);
      const size_t at = s.find("grpc=");
      if (at != std::string::npos) address_ = s.substr(at + 5, s.find(' ', at) - at - 5);
    }
    // The gateway prints nothing else on stdout, so the pipe stays open (and never fills)
    // until the gateway exits.
    keep_open_ = f;
    std::atexit([] { Gateway::Get().Stop(); });
    // It listens while it loads and answers UNAVAILABLE until its workers are ready: the
    // client's --wait-ready rides that out (the load takes well under a second here; the limit
    // is for busy machines).
    if (!address_.empty()) {
      testing::RunCommand({testing::BinDir() + "/thermocline", "generate", "--server", address_,
                           "-p", "x", "-n", "1", "--wait-ready", "120"});
    }
  }

  pid_t pid_ = 0;
  std::string address_;
  std::string log_;
  FILE* keep_open_ = nullptr;
};

std::string GatewayLog() {
  return testing::ReadFileOrDie(Gateway::Get().log());
}

testing::CommandResult Generate(std::vector<std::string> args) {
  args.insert(args.begin(), {testing::BinDir() + "/thermocline", "generate"});
  return testing::RunCommand(args);
}

const std::string kPrompt = "Once upon a time";

TEST(GenerateServerTest, GreedyStreamEqualsLocalGeneration) {
  const std::string& addr = Gateway::Get().address();
  ASSERT_FALSE(addr.empty()) << GatewayLog();
  for (const char* n : {"1", "40", "120"}) {
    auto remote = Generate({"--server", addr, "-p", kPrompt, "--temperature", "0", "-n", n});
    ASSERT_EQ(remote.exit_code, 0) << remote.err << GatewayLog();
    auto local = Generate({"-m", Stories(), "-p", kPrompt, "--temperature", "0", "-n", n,
                           "--threads", "1"});
    ASSERT_EQ(local.exit_code, 0) << local.err;
    EXPECT_EQ(remote.out, local.out) << "-n " << n;
    EXPECT_NE(remote.err.find("finish: "), std::string::npos) << remote.err;
    EXPECT_NE(remote.err.find(absl::StrCat("completion tokens")), std::string::npos) << remote.err;
  }
  // A sampled run with a seed is reproducible through the gateway and equals the local one.
  auto a = Generate({"--server", addr, "-p", kPrompt, "--seed", "7", "-n", "30"});
  auto b = Generate({"-m", Stories(), "-p", kPrompt, "--seed", "7", "-n", "30", "--threads", "1"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
}

TEST(GenerateServerTest, StopStringCutsTheText) {
  const std::string& addr = Gateway::Get().address();
  ASSERT_FALSE(addr.empty()) << GatewayLog();
  auto local = Generate({"-m", Stories(), "-p", kPrompt, "--temperature", "0", "-n", "60",
                         "--threads", "1"});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  // A stop string taken from the middle of the generated text.
  const std::string generated = local.out.substr(kPrompt.size());
  ASSERT_GT(generated.size(), 30u);
  const std::string stop = generated.substr(generated.size() / 2, 4);
  const size_t cut = generated.find(stop);
  auto remote = Generate({"--server", addr, "-p", kPrompt, "--temperature", "0", "-n", "60",
                          "--stop", "\x01never", "--stop", stop});
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  EXPECT_EQ(remote.out, kPrompt + generated.substr(0, cut) + "\n");
  EXPECT_NE(remote.err.find("finish: stop_sequence"), std::string::npos) << remote.err;
}

TEST(GenerateServerTest, LogprobsAndRequestId) {
  const std::string& addr = Gateway::Get().address();
  ASSERT_FALSE(addr.empty()) << GatewayLog();
  auto r = Generate({"--server", addr, "-p", kPrompt, "--temperature", "0", "-n", "3",
                     "--logprobs", "2", "--request-id", "client-test-1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t lines = 0;
  for (size_t at = r.err.find("logprob: token"); at != std::string::npos;
       at = r.err.find("logprob: token", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 3u) << r.err;
  EXPECT_NE(r.err.find("request client-test-1"), std::string::npos) << r.err;
}

TEST(GenerateServerTest, ErrorsNameTheStatusCode) {
  const std::string& addr = Gateway::Get().address();
  ASSERT_FALSE(addr.empty()) << GatewayLog();
  // Beyond the model's context (stories260K: 512 positions): the server refuses it.
  auto r = Generate({"--server", addr, "-p", kPrompt, "-n", "100000"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("INVALID_ARGUMENT"), std::string::npos) << r.err;
  // Nobody listens on port 1.
  r = Generate({"--server", "127.0.0.1:1", "-p", kPrompt, "-n", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("UNAVAILABLE"), std::string::npos) << r.err;
  // Client-side checks: local-only flags, and --stop without --server.
  r = Generate({"--server", addr, "-p", kPrompt, "--threads", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--threads is for local generation"), std::string::npos) << r.err;
  r = Generate({"-m", Stories(), "-p", kPrompt, "--stop", "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--stop needs --server"), std::string::npos) << r.err;
  // The server is still fine afterwards.
  r = Generate({"--server", addr, "-p", kPrompt, "--temperature", "0", "-n", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace thermocline
