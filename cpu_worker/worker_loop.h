// The CPU worker's message loop (docs/workers.md): each Activation from the GPU worker is
// decoded, computed over the cold rows and answered with a Partial (or an Error for a
// malformed one), stamped with the Activation's epoch.
#pragma once

#include "absl/status/status.h"
#include "cpu_worker/cold_executor.h"
#include "shared/ipc/worker_session.h"
#include "shared/model/model.h"

namespace thermocline::cpu_worker {

// Marks the worker ready and serves until Shutdown, SIGTERM or the gateway's death (OK), or a
// fatal transport error (returned).
absl::Status RunCpuWorker(ipc::WorkerSession& session, ColdExecutor& executor,
                          const ModelConfig& config);

}  // namespace thermocline::cpu_worker
