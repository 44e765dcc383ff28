// What the gateway's scheduler serves on: a BatchRunner (shared/runtime/generate.h) that also
// says which worker processes stand behind it and how often each was restarted, so that the
// scheduler can watch them for health and count restarts (docs/gateway.md#supervision).
//
// Why a gateway interface rather than more virtuals on BatchRunner: BatchRunner is the compute
// contract that local generation shares (ForwardPassRunner runs in-process and has no workers),
// and worker pids and restarts matter only to serving. Keeping them here leaves shared/runtime
// as it was (it must not know about shared/ipc or shared/driver), keeps the split engine
// untouched (SplitServingEngine adapts it), and lets the scheduler's tests supply a fake engine
// that implements exactly this.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "shared/runtime/generate.h"

namespace thermocline::gateway {

struct WorkerHealth {
  // 0 while a worker's pid is not known: the scheduler then has nothing to watch.
  pid_t gpu_pid = 0;
  pid_t cpu_pid = 0;
  // Restarts since the engine started; the scheduler counts the growth into its metrics.
  int64_t gpu_restarts = 0;
  int64_t cpu_restarts = 0;
};

// ResetSlot is called when a sequence leaves its slot (it ended, failed or was cancelled) and
// after each probe: the slot's history must not be replayed into the next sequence.
class ServingEngine : public BatchRunner {
 public:
  // As of the last Run (read on the scheduler's thread only, between Runs).
  virtual WorkerHealth health() const = 0;
};

}  // namespace thermocline::gateway
