// A thermocline-gateway (or any) process for the deploy and soak tests, started without a
// shell: stdout's first line is read (the gateway's "listening grpc=... metrics=..."), stderr
// goes to a file, and the exit status can be awaited. Unlike tests/e2e/gateway_harness.h it
// assumes nothing about the channel, so TLS and token tests can build their own.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/test_support.h"

extern char** environ;

namespace thermocline::testing {

class Process {
 public:
  // Starts argv; `log` receives stderr. The first stdout line is read only by FirstLine().
  Process(std::vector<std::string> argv, std::string log) : log_(std::move(log)) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) ADD_FAILURE() << "pipe";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> c;
    for (auto& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    const int rc = posix_spawn(&pid_, c[0], &fa, nullptr, c.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << rc;
      pid_ = -1;
      close(out[0]);
      return;
    }
    out_ = out[0];
  }
  ~Process() {
    if (out_ >= 0) close(out_);
    if (pid_ <= 0 || status_.has_value()) return;
    kill(pid_, SIGTERM);
    if (!Wait(20).has_value()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // The first stdout line ("" at EOF: the process exited first).
  std::string FirstLine() {
    std::string line;
    char ch;
    while (out_ >= 0 && read(out_, &ch, 1) == 1 && ch != '\n') line.push_back(ch);
    return line;
  }
  // Waits up to `seconds` for the exit; the wait status, or nullopt if it still runs.
  std::optional<int> Wait(int seconds) {
    if (status_.has_value()) return status_;
    for (int i = 0; i < seconds * 20; ++i) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        status_ = st;
        return status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::nullopt;
  }
  void Signal(int sig) { kill(pid_, sig); }
  std::string Log() const { return ReadFileOrDie(log_); }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string log_;
  std::optional<int> status_;
};

// The value of `key=` in a "listening grpc=H:P metrics=H:P" line.
inline std::string Field(const std::string& line, const std::string& key) {
  std::istringstream words(line);
  std::string w;
  while (words >> w) {
    if (w.rfind(key + "=", 0) == 0) return w.substr(key.size() + 1);
  }
  return "";
}

// Runs a command line through the shell (test setup only: openssl, cmake), output to `log`.
inline int Shell(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace thermocline::testing
