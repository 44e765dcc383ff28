// Which kernel family MatMul, GatherMatMul and AxpyRows run. Internal to shared/kernels/ and
// its tests.
#pragma once

#include "shared/util/cpu_features.h"

namespace thermocline {

// The level in use: DetectSimdLevel() at first use unless a test forced another.
SimdLevel ActiveKernelSimdLevel();
// Whether the AVX2 kernels form quantized block sums with AVX-VNNI (chosen by CPU support;
// THERMOCLINE_SIMD=portable turns it off with the rest of AVX2). False at the other levels
// (the avx512 family always has VNNI, in its EVEX form).
bool ActiveKernelUsesVnni();

// Lets one test process check every kernel family. Returns false, changing nothing, when this
// CPU cannot run `level` (and AVX-VNNI, if `vnni`, which only the avx2 level takes). Not thread-safe against concurrent calls.
bool SetSimdLevelForTesting(SimdLevel level, bool vnni = false);

}  // namespace thermocline
