#include "shared/util/version.h"

// Set for this file only (shared/CMakeLists.txt), so a new version recompiles one file.
#ifndef THERMOCLINE_VERSION
#error "THERMOCLINE_VERSION is defined by shared/CMakeLists.txt"
#endif

namespace thermocline {

const char* Version() { return THERMOCLINE_VERSION; }

}  // namespace thermocline
