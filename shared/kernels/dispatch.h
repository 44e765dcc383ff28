// Which kernel family MatMul, GatherMatMul and AxpyRows run. Internal to shared/kernels/ and
// its tests.
#pragma once

#include "shared/util/cpu_features.h"

namespace thermocline {

// The level in use: DetectSimdLevel() at first use unless a test forced another.
SimdLevel ActiveKernelSimdLevel();
// Whether the AVX2 kernels form quantized block sums with AVX-VNNI (chosen by CPU support;
// THERMOCLINE_SIMD=portable turns it off with the rest of AVX2).
bool ActiveKernelUsesVnni();

// Lets one test process check every kernel family. Returns false, changing nothing, when this
// CPU cannot run `level` (and AVX-VNNI, if `vnni`). Not thread-safe against concurrent calls.
bool SetSimdLevelForTesting(SimdLevel level, bool vnni = false);

}  // namespace thermocline
