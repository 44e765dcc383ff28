// The project's version (CMake's project(VERSION)), printed by every binary's --version.
#pragma once

namespace thermocline {

const char* Version();

}  // namespace thermocline
