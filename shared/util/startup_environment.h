// What every program checks in its environment before anything else (the command line, the
// gateway and both workers): the THERMOCLINE_* switches (env_switches.h) and THERMOCLINE_SIMD
// (cpu_features.h), so that a typo stops the program with a message naming the variable
// instead of being read as a default. Apart from env_switches.h because it needs the kernel
// families' names, which the switches themselves do not.
#pragma once

#include "absl/status/status.h"

namespace thermocline {

// OK, or one InvalidArgument error that names each bad variable: a switch other than unset,
// empty, 0 or 1, or THERMOCLINE_SIMD other than unset, empty, portable, avx2 or avx512.
absl::Status CheckEnvironmentSwitches();

}  // namespace thermocline
