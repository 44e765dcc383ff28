// Which kernel family MatMul, GatherMatMul and AxpyRows run. Internal to shared/kernels/ and
// its tests.
#pragma once

#include "shared/util/cpu_features.h"

namespace thermocline {

// The level in use: DetectSimdLevel() at first use unless a test forced another.
SimdLevel ActiveKernelSimdLevel();

// Lets one test process check both kernel families. Returns false, changing nothing, when this
// CPU cannot run `level`. Not thread-safe against concurrent MatMul calls.
bool SetSimdLevelForTesting(SimdLevel level);

}  // namespace thermocline
