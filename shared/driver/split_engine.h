// The split engine: a BatchRunner whose forward pass runs in two worker processes
// (thermocline-gpu-worker: attention, KV cache, hot FFN neurons, output head;
// thermocline-cpu-worker: cold FFN neurons), driven through the instance's shared-memory rings.
// `generate --split` uses it for one sequence; the gateway reuses it for many (it schedules
// and samples; this class forms steps, reads logits, and keeps the workers alive).
//
// Run() has ForwardPass::Run's contract. Recovery is invisible to the caller apart from
// stats() and one line on stderr per restart:
//   - a worker that dies while idle is restarted before the next step is sent;
//   - the cpu_worker dies during a step: the gpu_worker abandons it and answers Unavailable
//     (its KV cache survives); the cpu_worker is restarted under a new epoch and the step is
//     sent again under a new step id;
//   - the gpu_worker dies (or hangs): its KV cache is gone; it is restarted under a new epoch,
//     every slot's submitted tokens are replayed as prefill steps (SlotHistory), and the step
//     is sent again.
// Restarts are bounded by the supervisor's RestartPolicy; past it Run() returns Unavailable
// naming the worker and its last exit.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shared/driver/restart_budget.h"
#include "shared/driver/slot_history.h"
#include "shared/driver/supervisor.h"
#include "shared/ipc/ring.h"
#include "shared/ipc/transport.h"
#include "shared/model/model.h"
#include "shared/runtime/generate.h"
#include "shared/runtime/kv_blocks.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/teal_profile.h"
#include "shared/util/file_identity.h"

namespace thermocline::driver {

struct SplitEngineOptions {
  std::string instance;  // "" = "gen-<pid>-<n>", unique per engine of this process
  std::string model_path;
  // The model's shapes (the caller has loaded it for its tokenizer): vocab and positions for
  // validating steps, dims for sizing the rings.
  ModelConfig config;

  // Placement of the FFN neurons: a plan from `thermocline plan`, or a fixed hot fraction.
  std::string plan_path;
  std::optional<double> hot_fraction;
  SparsityFlags sparsity;  // passed to both workers
  TealFlags teal;          // TEAL: attention (gpu worker); with --sparsity teal the FFN too (both)

  int gpu_threads = 1;
  int cpu_threads = 1;
  int32_t kv_slots = 4;
  int32_t context = 0;     // positions per slot (0 = the model's context length)
  // KV blocks beyond the slots' own, kept for the prefix cache (docs/split.md#prefix-cache);
  // 0: off (the contiguous cache, no sharing, Steps without KV tables).
  int32_t prefix_cache_blocks = 0;
  int32_t max_batch = 512;  // entries per step (longer batches are split)
  // Logits rows per step at most (longer ones are split): sizes the gpu->gateway ring.
  int32_t max_logits_rows = 64;
  std::string kv_type = "f32";
  std::string check_tensors = "auto";  // both workers' --check-tensors
  std::string gpu_backend = "host";  // gpu_worker --backend: host, or cuda (docs/cuda.md)
  std::string cpus;                // cpu_worker --cpus
  std::optional<int> numa_node;    // cpu_worker --numa-node
  bool mlock = false;              // cpu_worker --mlock
  std::vector<std::string> extra_gpu_args, extra_cpu_args;  // appended verbatim

  std::string bindir;    // where the worker executables are ("" = this executable's directory)
  bool attach = false;   // the workers are started by someone else; only watch them
  std::string log_path;  // workers' stdout and stderr appended here ("" = the driver's stderr)
  RestartPolicy restart;
  absl::Duration ready_timeout = absl::Seconds(120);
  // A step the gpu_worker (alive and heartbeating) has not answered within this is taken for
  // a hang: the worker is killed and restarted. Long: a 512-entry prefill chunk of a large
  // model on a loaded machine takes tens of seconds.
  absl::Duration step_timeout = absl::Seconds(300);
  // SupervisorOptions::hang_timeout: a worker whose compute thread makes no progress this long
  // is killed and replaced, whatever its heartbeat says.
  absl::Duration hang_timeout = absl::Seconds(60);
  bool log_restarts = true;  // one line on stderr per recovery

  // Observation hook, called after each step is sent and before its reply is awaited (step id,
  // steps completed so far). Tests use it to kill a worker while a step is in flight.
  std::function<void(uint64_t step_id, int64_t steps_done)> on_step_sent;
};

struct SplitEngineStats {
  int64_t steps = 0;            // steps answered (replays included)
  int64_t restarts = 0;         // worker processes restarted
  int64_t gpu_restarts = 0;
  int64_t cpu_restarts = 0;
  int64_t resent_steps = 0;     // steps sent again after a failure
  int64_t replayed_tokens = 0;  // tokens resubmitted to rebuild a restarted gpu_worker's cache
  int64_t stale_replies = 0;    // replies to an abandoned step id, dropped
};

// One caller at a time (the gateway's scheduler thread, or generate's loop): steps are
// strictly sequential, as the protocol has one step in flight.
class SplitEngine final : public BatchRunner {
 public:
  // Creates the instance's transport, starts both workers (or, attach mode, waits for them)
  // and returns once both are ready.
  static absl::StatusOr<std::unique_ptr<SplitEngine>> Create(SplitEngineOptions options);
  // Shutdown message, then SIGTERM, then SIGKILL; reaps the workers and removes the segment.
  ~SplitEngine() override;

  absl::Status Run(std::span<const BatchEntry> batch, std::vector<float>& logits) override;
  int64_t vocab_size() const override { return options_.config.vocab_size; }
  int64_t context() const override { return options_.context; }
  void ResetSlot(int32_t slot) override { ReleaseSlot(slot); }
  // The slot's sequence ended: forget its history, so it is not replayed, and release its KV
  // blocks (the prefix cache keeps the full ones).
  void ReleaseSlot(int32_t slot);
  // The prefix cache: this process decides which blocks a slot uses; each Step tells the
  // gpu_worker the tables of the slots it writes and the copies to make first.
  int32_t ReusePrefix(int32_t slot, std::span<const int32_t> tokens) override;
  absl::Status ForkSlot(int32_t src, int32_t dst, int32_t n) override;
  PrefixCacheStats prefix_cache_stats() const override { return blocks_.stats(); }
  const KvBlockManager& blocks() const { return blocks_; }

  const SplitEngineStats& stats() const { return stats_; }
  const std::string& instance() const { return options_.instance; }
  const SplitEngineOptions& options() const { return options_; }
  pid_t worker_pid(ipc::Role role) const { return supervisor_->pid(role); }
  const SlotHistory& history() const { return history_; }

 private:
  SplitEngine(SplitEngineOptions options, std::unique_ptr<ipc::Transport> transport);
  absl::Status Init();
  struct Failure {
    std::vector<ipc::Role> roles;
    std::string why;
  };
  // Runs `entries` (at most max_batch, at most max_logits_rows wanting logits) to completion,
  // recovering from worker deaths.
  absl::Status Execute(std::span<const ipc::StepEntry> entries, const KvPlan& plan,
                       int32_t n_want, float* out);
  // One send and its reply. A worker failure is returned in *failure with an OK status; an
  // error status is not recoverable by a restart (bad input, a corrupt ring).
  absl::Status Attempt(std::span<const ipc::StepEntry> entries, const KvPlan& plan,
                       int32_t n_want, float* out, std::optional<Failure>* failure);
  // Restarts the failed workers and adopts the new epoch; a gpu_worker restart schedules a
  // replay of every slot.
  absl::Status Recover(const Failure& failure);
  // Unavailable, marked kGivenUpPayload, when the model (or plan) file is not the one the
  // workers loaded: a worker started now would load other bytes than the survivor holds.
  absl::Status CheckInputsUnchanged(const Failure& failure) const;
  absl::Status Replay(std::optional<Failure>* failure);
  std::optional<Failure> DeadWorkers();

  SplitEngineOptions options_;
  std::unique_ptr<ipc::Transport> transport_;
  std::optional<ipc::RingProducer> to_gpu_;
  std::optional<ipc::RingConsumer> from_gpu_;
  std::unique_ptr<Supervisor> supervisor_;
  // The files the workers load, as they were when the engine started them (path, identity).
  std::vector<std::pair<std::string, FileIdentity>> inputs_;
  int log_fd_ = -1;
  SlotHistory history_;
  KvBlockManager blocks_;
  bool replay_pending_ = false;
  uint64_t last_step_id_ = 0;
  SplitEngineStats stats_;
};

// The worker command lines the engine runs (exposed for tests and for `--dry-run`-style
// diagnostics): argv of the gpu and the cpu worker.
std::vector<std::string> GpuWorkerArgv(const SplitEngineOptions& options);
std::vector<std::string> CpuWorkerArgv(const SplitEngineOptions& options);
// The directory of the running executable (/proc/self/exe), where the worker binaries live.
absl::StatusOr<std::string> SelfBinDir();

}  // namespace thermocline::driver
