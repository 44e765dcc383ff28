#include "shared/util/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace thermocline {

SimdLevel CpuSimdLevel() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // GCC's checks include the OS's XSAVE support for the ymm/zmm state.
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni");
  if (avx2 && avx512) return SimdLevel::kAvx512;
  if (avx2) return SimdLevel::kAvx2;
#endif
  return SimdLevel::kPortable;
}

SimdLevel DetectSimdLevel() {
  const SimdLevel cpu = CpuSimdLevel();
  const char* force = std::getenv("THERMOCLINE_SIMD");
  if (force == nullptr || *force == '\0') return cpu;
  SimdLevel asked = cpu;
  bool known = false;
  for (SimdLevel l : {SimdLevel::kPortable, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (std::strcmp(force, SimdLevelName(l)) == 0) {
      asked = l;
      known = true;
    }
  }
  const SimdLevel level = std::min(asked, cpu);
  static std::atomic<bool> reported{false};
  if ((!known || asked > cpu) && !reported.exchange(true)) {
    if (!known) {
      std::fprintf(stderr,
                   "thermocline: THERMOCLINE_SIMD=%s is not one of portable, avx2, avx512; "
                   "using %s\n",
                   force, SimdLevelName(level));
    } else {
      std::fprintf(stderr, "thermocline: THERMOCLINE_SIMD=%s but this CPU has only %s; using %s\n",
                   force, SimdLevelName(cpu), SimdLevelName(level));
    }
  }
  return level;
}

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kPortable:
      return "portable";
  }
  return "unknown";
}

}  // namespace thermocline
