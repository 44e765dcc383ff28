#include "shared/driver/gpu_backend_flags.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/sparsity/planner.h"

namespace thermocline::driver {

absl::StatusOr<int64_t> ApplyGpuBackendFlags(const std::string& backend,
                                  const std::optional<std::string>& vram_budget,
                                  SplitEngineOptions& o) {
  if (std::find(std::begin(kGpuBackends), std::end(kGpuBackends), backend) ==
      std::end(kGpuBackends)) {
    return absl::InvalidArgumentError(absl::StrCat("--backend '", backend,
                                                   "' is not a gpu worker backend; backends: ",
                                                   absl::StrJoin(kGpuBackends, ", ")));
  }
  int64_t budget = 0;
  if (vram_budget.has_value()) {
    absl::StatusOr<int64_t> parsed = ParseByteSize(*vram_budget);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vram-budget: ", parsed.status().message()));
    }
    // The host backend would ignore it; saying so beats a budget that silently does nothing.
    if (backend != "cuda") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--vram-budget applies to --backend cuda only (the ", backend,
          " backend uses no device memory)"));
    }
    budget = *parsed;
  }
  o.gpu_backend = backend;
  // The worker reads the same syntax; the byte count leaves it nothing to read differently.
  if (vram_budget.has_value()) {
    o.extra_gpu_args.insert(o.extra_gpu_args.end(), {"--vram-budget", absl::StrCat(budget)});
  }
  return budget;
}

}  // namespace thermocline::driver
