#include "shared/util/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace thermocline {

SimdLevel DetectSimdLevel() {
  const char* force = std::getenv("THERMOCLINE_SIMD");
  if (force != nullptr && std::strcmp(force, "portable") == 0) return SimdLevel::kPortable;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return SimdLevel::kAvx2;
  }
#endif
  return SimdLevel::kPortable;
}

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kPortable:
      return "portable";
  }
  return "unknown";
}

}  // namespace thermocline
