// Which SIMD kernel family this CPU can run. Kernels are chosen once, at run time.
#pragma once

namespace thermocline {

enum class SimdLevel { kPortable, kAvx2 };

// kAvx2 needs AVX2, FMA and F16C. Setting THERMOCLINE_SIMD=portable in the environment forces
// the portable kernels (tests use it to check both paths on one machine).
SimdLevel DetectSimdLevel();
const char* SimdLevelName(SimdLevel level);

}  // namespace thermocline
