// The gateway's logs: shared/util/logfmt.h's lines with component=gateway unless a caller names
// another (the gateway's own parts: "http", "watchdog", ...).
#pragma once

#include <initializer_list>
#include <string_view>

#include "shared/util/logfmt.h"

namespace thermocline::gateway {

using ::thermocline::FormatLogLine;
using ::thermocline::Level;
using ::thermocline::LevelName;
using ::thermocline::LogField;
using ::thermocline::LogfmtValue;
using ::thermocline::SetMinLogLevel;

inline void Log(Level level, std::string_view event, std::initializer_list<LogField> fields = {},
                std::string_view component = "gateway") {
  ::thermocline::Log(level, event, fields, component);
}

}  // namespace thermocline::gateway
