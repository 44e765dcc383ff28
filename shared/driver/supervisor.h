// The two workers of one split instance: starts them, waits until they are ready, watches
// them, and restarts a dead one under a new epoch with backoff and a restart budget.
//
// Spawn mode (the default): the supervisor started the workers, so it learns of a death from
// waitpid(WNOHANG) at once, whatever the worker was doing; a worker that still runs but whose
// heartbeat is older than `stall_timeout` is hung, and is killed so it can be restarted.
// Attach mode: the workers were started by someone else (systemd, a test); the supervisor only
// watches their process slots (pid alive, heartbeat younger than `heartbeat_timeout`) and
// reports a death as Unavailable, since it cannot restart what it did not start.
//
// Ready = the role's slot says kReady, its process is alive (and is our child in spawn mode),
// and it attached under the transport's current epoch.
#pragma once

#include <sys/types.h>

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shared/driver/restart_budget.h"
#include "shared/driver/worker_process.h"
#include "shared/ipc/transport.h"

namespace thermocline::driver {

// The payload (absl::Status::SetPayload) that marks an Unavailable after which the driver will
// not bring the workers back by itself: a spent restart budget (its value: the worker's role),
// or a model file that changed since the workers loaded it (SplitEngine). A caller far up (the
// gateway) tells "this instance is lost" from a passing Unavailable by it, without parsing the
// message.
inline constexpr char kGivenUpPayload[] = "type.thermocline/driver.GivenUp";
inline bool IsGivenUp(const absl::Status& s) {
  return s.GetPayload(kGivenUpPayload).has_value();
}

struct WorkerSpec {
  ipc::Role role = ipc::Role::kGpuWorker;
  std::vector<std::string> argv;  // argv[0]: the executable's path (unused in attach mode)
};

struct SupervisorOptions {
  std::vector<WorkerSpec> workers;  // one per worker role, each role at most once
  bool attach = false;
  RestartPolicy restart;
  // Loading a model can take long on a busy machine; a worker that neither becomes ready nor
  // dies within this is killed and counted as a failed start.
  absl::Duration ready_timeout = absl::Seconds(120);
  // Attach mode: a worker whose heartbeat (every 50 ms) is older than this is dead.
  absl::Duration heartbeat_timeout = absl::Milliseconds(300);
  // Spawn mode: waitpid sees deaths at once, so the heartbeat only catches a hung worker; the
  // limit is loose because a worker starved of CPU on a loaded machine is slow, not hung.
  absl::Duration stall_timeout = absl::Seconds(5);
  // A ready worker whose compute thread shows no progress (Transport::Progress) for this long
  // is hung even though its heartbeat beats: killed (spawn mode) or reported dead (attach). It
  // bounds one message's work: a layer's cold half on the cpu worker, a step between two cold
  // exchanges on the gpu worker. Published in the transport so that the gpu worker gives up a
  // step on a hung cpu worker by the same rule. Zero: off.
  absl::Duration hang_timeout = absl::Seconds(60);
  int output_fd = -1;  // workers' stdout and stderr (-1: the driver's stderr)
};

// A worker found dead, and why ("killed by signal 9 (Killed)", "no heartbeat for 412 ms").
struct WorkerDeath {
  ipc::Role role = ipc::Role::kGpuWorker;
  std::string why;
};

class Supervisor {
 public:
  // `transport` (created by the caller, gateway side) must outlive the supervisor.
  Supervisor(ipc::Transport& transport, SupervisorOptions options);
  // Stop(): every child is gone when this returns.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Spawn mode: starts every worker and waits until all are ready (a worker that exits first is
  // an error naming it and its exit status; no restart: a worker that cannot start once, with
  // the same flags, will not start the second time). Attach mode: waits until the workers
  // started elsewhere are ready.
  absl::Status Start();

  // Liveness of every worker now: the dead ones (empty when all run). Cheap (one waitpid and
  // a few atomic loads per worker); also refreshes the driver's own heartbeat. A worker stays
  // reported until it is restarted.
  std::vector<WorkerDeath> Check();

  // Restarts the given workers (dead ones; a listed worker that still runs is killed first):
  // for each, a place in the restart budget and its backoff; then one epoch bump, the spawns,
  // and the wait for readiness. A worker that dies again while starting is retried within the
  // budget. Returns the new epoch. Unavailable when the budget is spent (naming the worker and
  // its last exit, marked with kGivenUpPayload) or in attach mode. While a ring is marked
  // corrupt the restart takes every worker (only then are the rings reset), so `*restarted`
  // (when given) receives the roles actually restarted, which may be more than `roles`.
  absl::StatusOr<uint64_t> Restart(std::span<const ipc::Role> roles,
                                   std::vector<ipc::Role>* restarted = nullptr);

  // SIGKILLs a worker (a hung one, or one its peer reported unavailable) and reaps it; the
  // next Check() reports it dead.
  void Kill(ipc::Role role, const std::string& why);

  // With `asked` (the caller has sent Shutdown), waits up to `grace` for the workers to exit
  // on their own; then SIGTERM (a clean exit for a worker) and up to `grace` again, then
  // SIGKILL; reaps all. Spawn mode only; attach mode leaves the workers alone.
  void Stop(absl::Duration grace = absl::Seconds(2), bool asked = true);

  // pid of the worker's current process (0 when none).
  pid_t pid(ipc::Role role) const;
  int64_t restarts() const { return restarts_; }
  bool attach() const { return options_.attach; }

 private:
  struct Worker {
    WorkerSpec spec;
    std::unique_ptr<WorkerProcess> process;  // spawn mode
    pid_t attached_pid = 0;                  // attach mode: the pid seen ready
    std::optional<std::string> dead;         // why, once found dead
    std::string last_exit;                   // description of the last death, for errors
    RestartBudget budget;
  };

  Worker* Find(ipc::Role role);
  const Worker* Find(ipc::Role role) const;
  absl::Status Spawn(Worker& w);
  // Waits until every worker in `which` is ready. On a worker dying or timing out, returns
  // Unavailable and marks it dead.
  absl::Status WaitReady(std::span<Worker* const> which);
  bool IsReady(const Worker& w) const;

  ipc::Transport& transport_;
  SupervisorOptions options_;
  std::vector<Worker> workers_;
  int64_t restarts_ = 0;
};

}  // namespace thermocline::driver
