// The gpu worker's backend as the programs that spawn it take it (`thermocline-gateway` in spawn
// mode, `thermocline generate --split`): --backend host|cuda and --vram-budget SIZE. Checked in
// the spawning process, so that a typo fails there at once with the flag's name instead of as a
// worker that exits while starting; then handed to the worker through SplitEngineOptions
// (docs/cuda.md). Whether a CUDA device is there is the worker's to find out: it answers
// --backend cuda without one by exiting with the reason, which the driver passes on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/driver/split_engine.h"

namespace thermocline::driver {

// The gpu worker's backends, as its --backend takes them.
inline constexpr const char* kGpuBackends[] = {"host", "cuda"};

// Sets o.gpu_backend to `backend` and, when `vram_budget` is given, appends
// "--vram-budget BYTES" to o.extra_gpu_args (the byte count, parsed as `thermocline plan`'s
// --vram-budget is: 6G, 6GiB, 1.5GiB, 512M, 4096; 0 = the device's free memory). Refused, with
// o unchanged: a backend not in kGpuBackends (the message names them), a size that does not
// parse (the message says why), a budget with the host backend (which uses no device memory).
// Returns the budget in bytes (0 when not given), for a caller that plans for it.
absl::StatusOr<int64_t> ApplyGpuBackendFlags(const std::string& backend,
                                  const std::optional<std::string>& vram_budget,
                                  SplitEngineOptions& o);

}  // namespace thermocline::driver
