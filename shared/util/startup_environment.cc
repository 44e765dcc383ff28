#include "shared/util/startup_environment.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/util/cpu_features.h"
#include "shared/util/env_switches.h"

namespace thermocline {
namespace {

absl::Status CheckSimd() {
  const char* v = std::getenv("THERMOCLINE_SIMD");
  if (v == nullptr || *v == '\0') return absl::OkStatus();
  if (SimdLevelFromName(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("THERMOCLINE_SIMD='", v, "' is not one of ", SimdLevelName(SimdLevel::kPortable),
                   ", ", SimdLevelName(SimdLevel::kAvx2), ", ", SimdLevelName(SimdLevel::kAvx512),
                   " (the most a kernel family may use)"));
}

}  // namespace

absl::Status CheckEnvironmentSwitches() {
  std::vector<std::string> bad;
  for (EnvSwitch s : AllEnvSwitches()) {
    if (absl::StatusOr<bool> on = ReadEnvSwitch(s); !on.ok())
      bad.emplace_back(on.status().message());
  }
  if (absl::Status simd = CheckSimd(); !simd.ok()) bad.emplace_back(simd.message());
  if (bad.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("bad environment: ", absl::StrJoin(bad, "; ")));
}

}  // namespace thermocline
