// A thermocline-gateway (or any) process for the deploy and soak tests, started without a
// shell: stdout's first line is read (the gateway's "listening grpc=... metrics=..."), stderr
// goes to a file, and the exit status can be awaited. Unlike tests/e2e/gateway_harness.h it
// assumes nothing about the channel, so TLS and token tests can build their own.
#pragma once

#include <signal.h>
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
#include "tests/process_spawn.h"
#include "tests/test_support.h"

namespace thermocline::testing {

class Process {
 public:
  // Starts argv; `log` receives stderr. The first stdout line is read only by FirstLine().
  Process(const std::vector<std::string>& argv, std::string log) : log_(std::move(log)) {
    auto child = SpawnProcess(argv, {.stdout_pipe = true, .stderr_file = log_});
    if (!child.ok()) {
      ADD_FAILURE() << child.status();
      return;
    }
    pid_ = child->pid;
    out_ = child->stdout_fd;
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
