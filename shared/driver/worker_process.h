// One child process of the driver: spawned with posix_spawn from an argv (no shell), watched
// with waitpid(WNOHANG), signalled, and always reaped. The split engine's workers are two of
// these; nothing here knows about the transport.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace thermocline::driver {

// "exited with status 3", "killed by signal 9 (Killed)": a waitpid status in words.
std::string DescribeWaitStatus(int status);

struct SpawnOptions {
  // File descriptor that becomes the child's stderr and stdout (-1: the child inherits the
  // caller's stderr for both). stdout is redirected too so that a worker's chatter never mixes
  // with the text a caller such as `generate` prints on its own stdout.
  int output_fd = -1;
};

class WorkerProcess {
 public:
  // Starts argv[0] (a path, not searched in PATH) with argv and the caller's environment.
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Spawn(const std::vector<std::string>& argv,
                                                              const SpawnOptions& options = {});

  // SIGKILLs a child that still runs and reaps it, so no zombie outlives the driver.
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }  // argv[0]'s base name
  // Whether the child has exited; reaps it when it has (non-blocking).
  bool Exited();
  // The raw waitpid status once Exited() (nullopt while it runs).
  std::optional<int> wait_status() const { return status_; }
  // DescribeWaitStatus of the exit, or "running".
  std::string ExitDescription() const;
  // Sends `signal` unless the child was already reaped (a reaped pid may belong to another
  // process by now, so it is never signalled).
  void Signal(int signal);
  // Polls Exited() every few milliseconds until it is true or `timeout` passes.
  bool WaitExit(absl::Duration timeout);
  // SIGKILL and reap (blocking; a SIGKILLed process cannot refuse).
  void KillAndReap();

 private:
  WorkerProcess(pid_t pid, std::string name) : pid_(pid), name_(std::move(name)) {}

  pid_t pid_;
  std::string name_;
  std::optional<int> status_;
};

}  // namespace thermocline::driver
