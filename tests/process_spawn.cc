#include "tests/process_spawn.h"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace thermocline::testing {
namespace {

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

absl::StatusOr<SpawnedProcess> SpawnProcess(const std::vector<std::string>& argv,
                                            const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("SpawnProcess: empty argv");
  if (options.stderr_pipe && !options.stderr_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SpawnProcess ", argv[0], ": stderr both a pipe and a file"));
  }
  // pipes[i] serves the child's descriptor i. Every end is close-on-exec: the child keeps only
  // the copies dup2 puts on 0/1/2 (the copy does not inherit the flag), and no other child the
  // test starts later inherits an end.
  const bool wanted[3] = {options.stdin_pipe, options.stdout_pipe, options.stderr_pipe};
  int pipes[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
  auto close_all = [&pipes] {
    for (auto& p : pipes) {
      CloseFd(p[0]);
      CloseFd(p[1]);
    }
  };
  for (int i = 0; i < 3; ++i) {
    if (wanted[i] && pipe2(pipes[i], O_CLOEXEC) != 0) {
      const int e = errno;
      close_all();
      return absl::InternalError(absl::StrCat("pipe for ", argv[0], ": ", std::strerror(e)));
    }
  }
  // The child reads its stdin from a pipe's read end and writes stdout and stderr to write ends.
  auto child_end = [](int i) { return i == 0 ? 0 : 1; };

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int i = 0; i < 3; ++i) {
    if (wanted[i]) posix_spawn_file_actions_adddup2(&actions, pipes[i][child_end(i)], i);
  }
  if (!options.stderr_file.empty()) {
    const int flags = O_WRONLY | O_CREAT | (options.stderr_append ? O_APPEND : O_TRUNC);
    posix_spawn_file_actions_addopen(&actions, 2, options.stderr_file.c_str(), flags, 0600);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  for (int i = 0; i < 3; ++i) CloseFd(pipes[i][child_end(i)]);
  if (rc != 0) {
    close_all();
    return absl::InternalError(absl::StrCat("cannot spawn ", argv[0], ": ", std::strerror(rc)));
  }
  SpawnedProcess child;
  child.pid = pid;
  child.stdin_fd = pipes[0][1];
  child.stdout_fd = pipes[1][0];
  child.stderr_fd = pipes[2][0];
  return child;
}

}  // namespace thermocline::testing
