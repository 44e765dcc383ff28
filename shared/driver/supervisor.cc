#include "shared/driver/supervisor.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "shared/util/status_macros.h"

namespace thermocline::driver {
namespace {

// How often readiness is polled while workers load: short next to a model load, long enough
// not to steal a busy machine's cores from the loading workers.
constexpr auto kReadyPoll = std::chrono::milliseconds(5);

std::string Role(ipc::Role role) { return std::string(ipc::RoleName(role)); }

}  // namespace

Supervisor::Supervisor(ipc::Transport& transport, SupervisorOptions options)
    : transport_(transport), options_(std::move(options)) {
  for (const WorkerSpec& spec : options_.workers) {
    Worker w{spec, nullptr, 0, std::nullopt, "", RestartBudget(options_.restart)};
    workers_.push_back(std::move(w));
  }
}

Supervisor::~Supervisor() { Stop(absl::ZeroDuration()); }

Supervisor::Worker* Supervisor::Find(ipc::Role role) {
  for (Worker& w : workers_) {
    if (w.spec.role == role) return &w;
  }
  return nullptr;
}

const Supervisor::Worker* Supervisor::Find(ipc::Role role) const {
  for (const Worker& w : workers_) {
    if (w.spec.role == role) return &w;
  }
  return nullptr;
}

pid_t Supervisor::pid(ipc::Role role) const {
  const Worker* w = Find(role);
  if (w == nullptr) return 0;
  if (options_.attach) return w->attached_pid;
  return w->process != nullptr && !w->process->wait_status().has_value() ? w->process->pid() : 0;
}

absl::Status Supervisor::Spawn(Worker& w) {
  if (w.process != nullptr) w.process->KillAndReap();
  w.process.reset();
  SpawnOptions so;
  so.output_fd = options_.output_fd;
  TC_ASSIGN_OR_RETURN(w.process, WorkerProcess::Spawn(w.spec.argv, so));
  w.dead.reset();
  return absl::OkStatus();
}

bool Supervisor::IsReady(const Worker& w) const {
  const ipc::ProcessInfo info = transport_.Process(w.spec.role);
  if (info.state != ipc::ProcessState::kReady || !info.alive) return false;
  if (info.epoch != transport_.epoch()) return false;
  return options_.attach || (w.process != nullptr && info.pid == w.process->pid());
}

absl::Status Supervisor::WaitReady(std::span<Worker* const> which) {
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options_.ready_timeout);
  for (;;) {
    transport_.Heartbeat();
    bool all = true;
    for (Worker* w : which) {
      if (IsReady(*w)) {
        if (options_.attach) w->attached_pid = transport_.Process(w->spec.role).pid;
        continue;
      }
      all = false;
      if (!options_.attach && w->process->Exited()) {
        w->last_exit = w->process->ExitDescription();
        w->dead = w->last_exit;
        return absl::UnavailableError(absl::StrCat(Role(w->spec.role), " (",
                                                   w->spec.argv.front(), ") ", w->last_exit,
                                                   " while starting; see its output above"));
      }
    }
    if (all) return absl::OkStatus();
    if (std::chrono::steady_clock::now() >= deadline) {
      for (Worker* w : which) {
        if (IsReady(*w)) continue;
        const std::string why = absl::StrCat("not ready within ",
                                             absl::FormatDuration(options_.ready_timeout));
        if (!options_.attach) w->process->KillAndReap();
        w->last_exit = why;
        w->dead = why;
        return absl::UnavailableError(absl::StrCat(
            Role(w->spec.role), " ", why, " (slot state ",
            std::string(ipc::ProcessStateName(transport_.Process(w->spec.role).state)), ")"));
      }
    }
    std::this_thread::sleep_for(kReadyPoll);
  }
}

absl::Status Supervisor::Start() {
  TC_RETURN_IF_ERROR(transport_.SetHangTimeout(options_.hang_timeout));
  std::vector<Worker*> all;
  for (Worker& w : workers_) all.push_back(&w);
  if (!options_.attach) {
    for (Worker* w : all) {
      if (absl::Status s = Spawn(*w); !s.ok()) {
        Stop(absl::ZeroDuration());
        return s;
      }
    }
  }
  absl::Status s = WaitReady(all);
  if (!s.ok()) Stop(absl::ZeroDuration());
  return s;
}

std::vector<WorkerDeath> Supervisor::Check() {
  transport_.Heartbeat();
  std::vector<WorkerDeath> dead;
  // A corrupt ring stays corrupt for every process attached to it, and a worker restarted onto
  // it would die at attach: it counts as the death of every worker, so that Restart replaces
  // them all and resets every ring (the step that found the corruption has already failed with
  // DataLoss naming the ring).
  std::string corrupt;
  for (ipc::RingId r : transport_.CorruptRings()) {
    if (!corrupt.empty()) corrupt += ", ";
    corrupt += ipc::RingName(r);
  }
  for (Worker& w : workers_) {
    if (!w.dead.has_value() && !corrupt.empty()) {
      w.dead = absl::StrCat("replaced: ring ", corrupt, " is marked corrupt");
    }
    if (!w.dead.has_value()) {
      const ipc::ProcessInfo info = transport_.Process(w.spec.role);
      const int64_t age_ns = transport_.HeartbeatAgeNs(w.spec.role);
      const int64_t idle_ns = transport_.ProgressAgeNs(w.spec.role);
      const bool stuck = info.state == ipc::ProcessState::kReady &&
                         options_.hang_timeout > absl::ZeroDuration() &&
                         idle_ns > absl::ToInt64Nanoseconds(options_.hang_timeout);
      const std::string stuck_why = absl::StrCat(
          "hung: its compute thread made no progress for ", idle_ns / 1000000,
          " ms (heartbeat ", age_ns / 1000000, " ms old)");
      if (options_.attach) {
        if (!info.alive || info.pid != w.attached_pid) {
          w.dead = absl::StrCat("process ", w.attached_pid, " is gone");
        } else if (age_ns > absl::ToInt64Nanoseconds(options_.heartbeat_timeout)) {
          w.dead = absl::StrCat("no heartbeat for ", age_ns / 1000000, " ms");
        } else if (stuck) {
          w.dead = stuck_why;
        }
      } else if (w.process == nullptr || w.process->Exited()) {
        w.dead = w.process == nullptr ? "not started" : w.process->ExitDescription();
      } else if (info.pid == w.process->pid() && info.state == ipc::ProcessState::kReady &&
                 age_ns > absl::ToInt64Nanoseconds(options_.stall_timeout)) {
        w.process->KillAndReap();
        w.dead = absl::StrCat("hung (no heartbeat for ", age_ns / 1000000, " ms), killed");
      } else if (info.pid == w.process->pid() && stuck) {
        w.process->KillAndReap();
        w.dead = absl::StrCat(stuck_why, ", killed");
      }
      if (w.dead.has_value()) w.last_exit = *w.dead;
    }
    if (w.dead.has_value()) dead.push_back(WorkerDeath{w.spec.role, *w.dead});
  }
  return dead;
}

void Supervisor::Kill(ipc::Role role, const std::string& why) {
  Worker* w = Find(role);
  if (w == nullptr || w->dead.has_value()) return;
  if (!options_.attach && w->process != nullptr) w->process->KillAndReap();
  w->dead = why;
  w->last_exit = why;
}

absl::StatusOr<uint64_t> Supervisor::Restart(std::span<const ipc::Role> roles,
                                             std::vector<ipc::Role>* restarted) {
  std::vector<Worker*> which;
  for (ipc::Role role : roles) {
    Worker* w = Find(role);
    if (w == nullptr) return absl::InvalidArgumentError(absl::StrCat("no worker ", Role(role)));
    if (std::find(which.begin(), which.end(), w) == which.end()) which.push_back(w);
  }
  if (which.empty()) return transport_.epoch();
  if (options_.attach) {
    return absl::UnavailableError(absl::StrCat(
        Role(which.front()->spec.role), " died (", which.front()->last_exit,
        "); in attach mode the driver does not restart workers (restart it, then the driver)"));
  }
  for (;;) {
    // A ring marked corrupt is reset only with every worker gone (below). Check() widens a
    // failure to all workers when it sees one, but a ring can also be marked while a restart
    // is under way (a worker that dies on it while starting, or memory scribbled meanwhile):
    // restarting the one worker again would meet the same mark every time, until the budget
    // is spent. Found by the 10-minute soak.
    if (which.size() != workers_.size() && !transport_.CorruptRings().empty()) {
      for (Worker& w : workers_) {
        if (std::find(which.begin(), which.end(), &w) != which.end()) continue;
        if (!w.dead.has_value()) w.last_exit = "replaced: a ring is marked corrupt";
        which.push_back(&w);
      }
    }
    absl::Duration delay = absl::ZeroDuration();
    for (Worker* w : which) {
      if (w->process != nullptr && !w->process->Exited()) {
        w->process->KillAndReap();
        if (!w->dead.has_value()) w->last_exit = "killed by the driver for a restart";
      }
      absl::StatusOr<absl::Duration> d = w->budget.Next(absl::Now());
      if (!d.ok()) {
        absl::Status spent = absl::UnavailableError(absl::StrCat(
            Role(w->spec.role), " (", w->spec.argv.front(), ") keeps dying: last ",
            w->last_exit, "; restart budget spent: ", d.status().message(), ", giving up"));
        spent.SetPayload(kGivenUpPayload, absl::Cord(Role(w->spec.role)));
        return spent;
      }
      delay = std::max(delay, *d);
    }
    if (delay > absl::ZeroDuration()) {
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(delay));
    }
    // With every worker gone nobody but us is attached to any ring: each is reset, so that
    // a corrupt one (or whatever a dead process left half-written) cannot outlive the restart.
    // With a survivor the rings stay: it holds its ends, and the epoch below fences them.
    if (which.size() == workers_.size()) {
      for (int r = 0; r < ipc::kNumRings; ++r) {
        TC_RETURN_IF_ERROR(transport_.ResetRing(static_cast<ipc::RingId>(r)));
      }
    }
    // The new epoch exists before the new process does, so it attaches under it and every
    // message of the old epoch (the dead process's, and the survivors' replies to it) is
    // dropped by the consumers.
    TC_ASSIGN_OR_RETURN(const uint64_t epoch, transport_.BumpEpoch());
    for (Worker* w : which) TC_RETURN_IF_ERROR(Spawn(*w));
    restarts_ += static_cast<int64_t>(which.size());
    absl::Status ready = WaitReady(which);
    if (ready.ok()) {
      if (restarted != nullptr) {
        restarted->clear();
        for (Worker* w : which) restarted->push_back(w->spec.role);
      }
      return epoch;
    }
    // One of them died or hung while starting: try again, within the budget.
  }
}

void Supervisor::Stop(absl::Duration grace, bool asked) {
  if (options_.attach) return;
  auto all_exited = [&] {
    bool all = true;
    for (Worker& w : workers_) {
      if (w.process != nullptr && !w.process->Exited()) all = false;
    }
    return all;
  };
  auto wait = [&](absl::Duration d) {
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(d);
    while (!all_exited() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  if (asked) wait(grace);
  if (!all_exited() && grace > absl::ZeroDuration()) {
    for (Worker& w : workers_) {
      if (w.process != nullptr) w.process->Signal(SIGTERM);
    }
    wait(grace);
  }
  for (Worker& w : workers_) {
    if (w.process != nullptr) w.process->KillAndReap();
  }
}

}  // namespace thermocline::driver
