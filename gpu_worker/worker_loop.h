// The GPU worker's message loop (docs/workers.md): waits for Steps from the gateway, runs each
// on the backend with the rings to the CPU worker as its ColdLink, and answers with Logits or
// an Error. It owns the four ring ends; the backend owns the compute.
#pragma once

#include "absl/status/status.h"
#include "gpu_worker/backend.h"
#include "shared/ipc/worker_session.h"
#include "shared/model/model.h"

namespace thermocline::gpu_worker {

// Marks the worker ready and serves until Shutdown, SIGTERM or the gateway's death (OK), or a
// fatal transport error (returned).
absl::Status RunGpuWorker(ipc::WorkerSession& session, Backend& backend,
                          const ModelConfig& config);

}  // namespace thermocline::gpu_worker
