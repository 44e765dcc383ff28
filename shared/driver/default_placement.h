// The placement a split engine gets when its caller (the gateway, `generate --split`) names
// neither --plan nor --hot-fraction.
//
// With the host backend the "gpu" half runs on this machine's CPU too, so splitting buys
// nothing: the whole FFN stays hot. With a device backend the share that fits depends on the
// device's memory: the budget is --vram-budget when given, else the device's free memory as the
// gpu worker reads it (`thermocline-gpu-worker --device-memory`, run once before the workers
// start), and the plan is `thermocline plan`'s for that budget and the serving KV cache,
// written where the workers read it. Neurons are ranked by the activation statistics when the
// caller has them (--stats), else every neuron counts the same (a uniform share per layer by
// bytes), which the log says, with how to do better.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace thermocline::driver {

struct DeviceMemory {
  int device = 0;
  std::string name;
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// The gpu worker's `--device-memory` line: logfmt `device=0 name="..." free_bytes=N total_bytes=M`.
absl::StatusOr<DeviceMemory> ParseDeviceMemoryLine(const std::string& line);

// Runs `gpu_worker_path --device-memory` (no shell; stdout and stderr read), bounded by a
// timeout. Errors carry what the worker said (no CUDA in this build, no usable device).
absl::StatusOr<DeviceMemory> ProbeDeviceMemory(const std::string& gpu_worker_path);

struct DefaultPlacementOptions {
  std::string gpu_backend = "host";
  std::string model_path;
  std::string stats_path;      // empty: no statistics, every neuron counts the same
  std::string predictor_path;  // empty: the model's own predictors, if any, are charged
  int64_t vram_budget = 0;     // bytes; 0: the device's free memory (probed)
  // The KV cache the caller serves, charged and recorded in the plan (the gateway refuses a
  // plan made for another one).
  int64_t context = 0;
  int32_t kv_slots = 4;
  std::string kv_type = "f32";
  std::string bindir;  // where thermocline-gpu-worker is, for the probe ("": this executable's)
  // Where a planned placement is written; empty: a new private directory under $TMPDIR (or
  // /tmp), which RemoveDefaultPlan deletes.
  std::string plan_path;
};

struct DefaultPlacement {
  std::optional<double> hot_fraction;  // set: no plan file (the host backend's whole FFN)
  std::string plan_path;               // set: the plan written
  std::string plan_dir;                // set when the plan's directory was made for it
  int64_t budget = 0;                  // bytes planned for (device backends)
  std::string budget_source;           // "--vram-budget" or "device free memory"
  double gpu_ffn_share = 0;            // of the FFN's bytes placed on the device
  bool ranked_by_stats = false;
  std::string why;                     // one sentence for the log
};

absl::StatusOr<DefaultPlacement> ChooseDefaultPlacement(const DefaultPlacementOptions& options);

// Deletes a plan ChooseDefaultPlacement wrote into a directory of its own (nothing otherwise).
void RemoveDefaultPlan(const DefaultPlacement& placement);

}  // namespace thermocline::driver
