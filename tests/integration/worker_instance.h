// The test's side of a worker instance, for tests that play the gateway against real worker
// processes: the transport (gateway role), the spawned thermocline-gpu-worker and
// thermocline-cpu-worker, and the gateway's ring ends (worker_processes_test,
// worker_metrics_test).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/ipc/messages.h"
#include "shared/ipc/transport.h"
#include "tests/process_spawn.h"
#include "tests/test_support.h"

namespace thermocline::testing {

// A small synthetic ReLU-gated model in PowerInfer's layout (fc1/fc2 predictors, so every
// sparsity mode runs), written once per test binary by the real command.
inline constexpr int kReluWorkerLayers = 2;
inline constexpr uint32_t kReluWorkerVocab = 300;
inline const std::string& ReluWorkerModel() {
  static const std::string path = [] {
    const std::string dir = TempDir();
    const std::string base = dir + "/relu.gguf", pwri = dir + "/relu.powerinfer.gguf";
    auto r = RunCommand({BinDir() + "/thermocline",
                         "synth",
                         "--ffn-kind",
                         "relu-gated",
                         "--dim",
                         "64",
                         "--ffn",
                         "128",
                         "--layers",
                         std::to_string(kReluWorkerLayers),
                         "--heads",
                         "4",
                         "--kv-heads",
                         "2",
                         "--vocab",
                         std::to_string(kReluWorkerVocab),
                         "--context",
                         "64",
                         "--seed",
                         "5",
                         "--threads",
                         "1",
                         "--powerinfer-output",
                         pwri,
                         "-o",
                         base});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return pwri;
  }();
  return path;
}

inline std::string UniqueInstance(const std::string& tag) {
  static int counter = 0;
  return absl::StrCat("wtest-", tag, "-", getpid(), "-", counter++);
}

// The test's side of an instance: the transport (gateway role), the spawned workers, and the
// gateway's ring ends.
class WorkerInstance {
 public:
  explicit WorkerInstance(const std::string& tag) : name_(UniqueInstance(tag)) {
    auto t = ipc::Transport::Create(name_);
    EXPECT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    auto out = transport_->Producer(ipc::RingId::kGatewayToGpu);
    auto in = transport_->Consumer(ipc::RingId::kGpuToGateway);
    EXPECT_TRUE(out.ok() && in.ok());
    to_gpu_ = std::make_unique<ipc::RingProducer>(std::move(*out));
    from_gpu_ = std::make_unique<ipc::RingConsumer>(std::move(*in));
  }
  virtual ~WorkerInstance() {
    for (pid_t& pid : pids_) Kill(pid);
    transport_.reset();
  }

  const std::string& name() const { return name_; }
  ipc::Transport& transport() { return *transport_; }

  // Spawns a worker with stderr to a log file; returns its pid.
  pid_t Spawn(const std::string& binary, std::vector<std::string> args) {
    args.insert(args.begin(), {BinDir() + "/" + binary, "--instance", name_});
    log_ = TempDir() + "/" + name_ + ".log";
    pid_t pid = 0;
    auto child = SpawnProcess(args, {.stderr_file = log_, .stderr_append = true});
    if (child.ok()) {
      pid = child->pid;
    } else {
      ADD_FAILURE() << child.status();
    }
    pids_.push_back(pid);
    return pid;
  }

  std::string Log() const {
    std::error_code ec;
    return std::filesystem::exists(log_, ec) ? ReadFileOrDie(log_) : "";
  }

  // Waits (up to 30 s: the load runs on busy cores) for process `pid` to be ready in `role`'s
  // slot (a killed predecessor's slot still reads kReady, so the pid must match).
  bool WaitReady(ipc::Role role, pid_t pid) {
    for (int i = 0; i < 3000; ++i) {
      const ipc::ProcessInfo p = transport_->Process(role);
      if (p.pid == pid && p.alive && p.state == ipc::ProcessState::kReady) return true;
      if (p.state == ipc::ProcessState::kFailed) return false;
      usleep(10000);
    }
    return false;
  }

  // Spawns both workers with the same flags and waits for both to be ready.
  bool StartWorkers(const std::vector<std::string>& args, pid_t* gpu = nullptr,
                    pid_t* cpu = nullptr) {
    const pid_t g = Spawn("thermocline-gpu-worker", args);
    const pid_t c = Spawn("thermocline-cpu-worker", args);
    if (gpu != nullptr) *gpu = g;
    if (cpu != nullptr) *cpu = c;
    return WaitReady(ipc::Role::kGpuWorker, g) && WaitReady(ipc::Role::kCpuWorker, c);
  }

  // SIGKILL and reap (no-op for pid 0).
  static void Kill(pid_t& pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = 0;
  }
  // Waits up to 10 s for a process to exit on its own; its exit status, or -1.
  static int WaitExitOf(pid_t pid) {
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid)
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      usleep(10000);
    }
    return -1;
  }
  int WaitExit(pid_t pid) {
    Forget(pid);
    return WaitExitOf(pid);
  }
  // The destructor will not kill `pid`.
  void Forget(pid_t pid) {
    for (pid_t& p : pids_) {
      if (p == pid) p = 0;
    }
  }

  void Send(uint64_t step_id, const std::vector<ipc::StepEntry>& entries) {
    ASSERT_TRUE(ipc::SendStep(*to_gpu_, step_id, entries, absl::Seconds(5)).ok());
  }
  void SendShutdown() { ASSERT_TRUE(ipc::SendShutdown(*to_gpu_, absl::Seconds(5)).ok()); }
  // After BumpEpoch: steps go out under the new epoch.
  void AdoptEpoch() { to_gpu_->set_epoch(transport_->epoch()); }

  // The reply to `step_id` (earlier replies are skipped): logits, or the worker's error.
  absl::StatusOr<std::vector<float>> Reply(uint64_t step_id, uint32_t vocab,
                                           absl::Duration deadline = absl::Seconds(30)) {
    const absl::Time end = absl::Now() + deadline;
    std::vector<std::byte> payload;
    while (absl::Now() < end) {
      auto h = from_gpu_->Receive(&payload, absl::Milliseconds(50));
      if (absl::IsDeadlineExceeded(h.status())) continue;
      if (!h.ok()) return h.status();
      if (h->step_id != step_id) continue;
      const ipc::MessageView m = ipc::ViewOf(*h, payload);
      if (m.kind() == ipc::MessageKind::kError) {
        absl::Status sender;
        if (absl::Status s = ipc::DecodeError(m, &sender); !s.ok()) return s;
        return sender;
      }
      auto l = ipc::DecodeLogits(m, ipc::MatrixLimits{vocab, 1024, 0});
      if (!l.ok()) return l.status();
      return std::vector<float>(l->data.begin(), l->data.end());
    }
    return absl::DeadlineExceededError(absl::StrCat("no reply to step ", step_id));
  }

 private:
  std::string name_;
  std::unique_ptr<ipc::Transport> transport_;
  std::unique_ptr<ipc::RingProducer> to_gpu_;
  std::unique_ptr<ipc::RingConsumer> from_gpu_;
  std::vector<pid_t> pids_;
  std::string log_;
};

}  // namespace thermocline::testing
