#include "shared/driver/worker_process.h"

#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "shared/ipc/worker_session.h"

extern char** environ;

namespace thermocline::driver {

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) {
    if (WEXITSTATUS(status) == ipc::kExitMappedFileShrank) {
      return absl::StrCat("exited with status ", WEXITSTATUS(status),
                          " (SIGBUS: a file it had mapped shrank under it)");
    }
    return absl::StrCat("exited with status ", WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* what = sigdescr_np(sig);
    return absl::StrCat("killed by signal ", sig, " (", what != nullptr ? what : "unknown", ")");
  }
  return absl::StrCat("stopped with wait status ", status);
}

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Spawn(
    const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty() || argv[0].empty()) {
    return absl::InvalidArgumentError("spawn: no executable given");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (options.output_fd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, options.output_fd, 2);
    posix_spawn_file_actions_adddup2(&actions, options.output_fd, 1);
  } else {
    posix_spawn_file_actions_adddup2(&actions, 2, 1);
  }
  // The child gets its own process group: a terminal's Ctrl-C reaches the driver, which then
  // shuts the workers down in order instead of having them die mid-step alongside it.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  // Signals the driver ignores or blocks must not be inherited by a worker that relies on
  // SIGTERM for its clean exit.
  sigset_t all, none;
  sigfillset(&all);
  sigdelset(&all, SIGKILL);  // cannot be caught or ignored, so there is nothing to reset
  sigdelset(&all, SIGSTOP);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> cargs;
  cargs.reserve(argv.size() + 1);
  for (const std::string& a : argv) cargs.push_back(const_cast<char*>(a.c_str()));
  cargs.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, cargs[0], &actions, &attr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  const size_t slash = argv[0].rfind('/');
  std::string name = slash == std::string::npos ? argv[0] : argv[0].substr(slash + 1);
  return std::unique_ptr<WorkerProcess>(new WorkerProcess(pid, std::move(name)));
}

WorkerProcess::~WorkerProcess() { KillAndReap(); }

bool WorkerProcess::Exited() {
  if (status_.has_value()) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    status_ = status;
    return true;
  }
  if (r < 0 && errno == ECHILD) {
    // Someone else reaped it (a SIGCHLD handler set to SIG_IGN, say): it is gone, and why is
    // unknown. Record that rather than signal a pid that may have been reused.
    status_ = 0xff00;  // reads as "exited with status 255"
    return true;
  }
  return false;
}

std::string WorkerProcess::ExitDescription() const {
  return status_.has_value() ? DescribeWaitStatus(*status_) : "running";
}

void WorkerProcess::Signal(int signal) {
  if (!Exited()) kill(pid_, signal);
}

bool WorkerProcess::WaitExit(absl::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (!Exited()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void WorkerProcess::KillAndReap() {
  if (Exited()) return;
  kill(pid_, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  status_ = r == pid_ ? status : 0xff00;
}

}  // namespace thermocline::driver
