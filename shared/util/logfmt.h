// Structured logs of every Thermocline process: one logfmt line per event on stderr,
//   ts=2026-11-29T19:45:17.123456Z level=info component=gateway event=request_done request_id=r1
// so that journald, grep and log shippers can all split them without a schema. The gateway
// and both workers share one stderr (the unit's journal), so they share this one format;
// `component` says which process (gateway, gpu_worker, cpu_worker, driver) wrote the line. Values that
// need it (empty, or holding spaces, quotes, '=', or control characters) are double-quoted
// with \" \\ \n \r \t escapes; keys are written as given (callers use [a-z_]+).
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace thermocline {

enum class Level { kDebug, kInfo, kWarn, kError };
std::string_view LevelName(Level level);  // "debug", "info", "warn", "error"

struct LogField {
  std::string_view key;
  std::string value;
  LogField(std::string_view k, std::string_view v) : key(k), value(v) {}
  LogField(std::string_view k, const char* v) : key(k), value(v) {}
  LogField(std::string_view k, const std::string& v) : key(k), value(v) {}
  // Numbers and booleans without a str-conversion at every call site.
  LogField(std::string_view k, int v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, long v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, long long v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, unsigned v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, unsigned long v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, unsigned long long v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, double v);
  LogField(std::string_view k, bool v) : key(k), value(v ? "true" : "false") {}
};

// The time as Log writes it: RFC 3339 UTC with microseconds.
std::string LogTimestamp();
// The line Log writes, without the trailing newline (exposed for tests).
std::string FormatLogLine(std::string_view ts, Level level, std::string_view component,
                          std::string_view event, std::initializer_list<LogField> fields);
// `value` quoted and escaped when logfmt needs it, else as is.
std::string LogfmtValue(std::string_view value);
// The key=value pairs of one line as FormatLogLine writes them (quotes and escapes undone), in
// order; nullopt for a line that is not logfmt (a key without '=', an unterminated quote, a bad
// escape). For a process reading another's line, such as the gpu worker's --device-memory.
std::optional<std::vector<std::pair<std::string, std::string>>> ParseLogfmtLine(
    std::string_view line);

// Writes one line to stderr with a single write(2) under a mutex, so lines of concurrent
// threads never interleave (and lines of processes sharing the stderr pipe never split: one
// write of less than PIPE_BUF is atomic). Events below the minimum level (SetMinLogLevel) are
// dropped.
void Log(Level level, std::string_view event, std::initializer_list<LogField> fields,
         std::string_view component);
void SetMinLogLevel(Level level);

}  // namespace thermocline
