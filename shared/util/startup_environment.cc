#include "shared/util/startup_environment.h"

#include <cstdlib>
#include <string>
#include <string_view>
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
  std::vector<std::string> names;
  for (SimdLevel l : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (std::string_view(v) == SimdLevelName(l)) return absl::OkStatus();
    names.push_back(SimdLevelName(l));
  }
  return absl::InvalidArgumentError(absl::StrCat("THERMOCLINE_SIMD='", v, "' is not one of ",
                                                 absl::StrJoin(names, ", "),
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
