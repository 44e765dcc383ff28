#include "shared/util/logfmt.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "shared/util/escape.h"

namespace thermocline {
namespace {

std::atomic<int> g_min_level{static_cast<int>(Level::kInfo)};
std::mutex g_write_mu;

bool NeedsQuotes(std::string_view v) {
  if (v.empty()) return true;
  for (unsigned char c : v) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f) return true;
  }
  return false;
}

}  // namespace

// RFC 3339 UTC with microseconds: sortable, and unambiguous across time zones.
std::string LogTimestamp() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  gmtime_r(&ts.tv_sec, &utc);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long>(ts.tv_nsec / 1000) % 1000000);
  return buf;
}

LogField::LogField(std::string_view k, double v) : key(k) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  value = buf;
}

std::string_view LevelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

std::string LogfmtValue(std::string_view v) {
  if (!NeedsQuotes(v)) return std::string(v);
  std::string out = "\"";
  AppendEscaped(v, &out);
  out += '"';
  return out;
}

std::string FormatLogLine(std::string_view ts, Level level, std::string_view component,
                          std::string_view event, std::initializer_list<LogField> fields) {
  std::string line;
  line.reserve(128);
  line.append("ts=").append(ts);
  line.append(" level=").append(LevelName(level));
  line.append(" component=").append(LogfmtValue(component));
  line.append(" event=").append(LogfmtValue(event));
  for (const LogField& f : fields) {
    line.append(" ").append(f.key).append("=").append(LogfmtValue(f.value));
  }
  return line;
}

std::optional<std::vector<std::pair<std::string, std::string>>> ParseLogfmtLine(
    std::string_view line) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  const size_t n = line.size();
  while (true) {
    while (i < n && line[i] == ' ') ++i;
    if (i == n) return out;
    const size_t key_begin = i;
    while (i < n && line[i] != '=' && line[i] != ' ') ++i;
    if (i == n || line[i] != '=' || i == key_begin) return std::nullopt;
    std::string key(line.substr(key_begin, i - key_begin));
    ++i;  // '='
    std::string value;
    if (i < n && line[i] == '"') {
      ++i;
      bool closed = false;
      while (i < n) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c != '\\') {
          value += c;
          continue;
        }
        if (i == n) return std::nullopt;
        const char e = line[i++];
        switch (e) {
          case '"': value += '"'; break;
          case '\\': value += '\\'; break;
          case 'n': value += '\n'; break;
          case 'r': value += '\r'; break;
          case 't': value += '\t'; break;
          case 'x': {
            if (n - i < 2) return std::nullopt;
            int byte = 0;
            for (int k = 0; k < 2; ++k) {
              const char h = line[i++];
              byte <<= 4;
              if (h >= '0' && h <= '9') byte |= h - '0';
              else if (h >= 'a' && h <= 'f') byte |= h - 'a' + 10;
              else return std::nullopt;
            }
            value += static_cast<char>(byte);
            break;
          }
          default:
            return std::nullopt;
        }
      }
      if (!closed || (i < n && line[i] != ' ')) return std::nullopt;
    } else {
      const size_t v_begin = i;
      while (i < n && line[i] != ' ') ++i;
      value.assign(line.substr(v_begin, i - v_begin));
      if (value.find_first_of("\"=") != std::string::npos) return std::nullopt;
    }
    out.emplace_back(std::move(key), std::move(value));
  }
}

void SetMinLogLevel(Level level) { g_min_level.store(static_cast<int>(level)); }

void Log(Level level, std::string_view event, std::initializer_list<LogField> fields,
         std::string_view component) {
  if (static_cast<int>(level) < g_min_level.load(std::memory_order_relaxed)) return;
  std::string line = FormatLogLine(LogTimestamp(), level, component, event, fields);
  line += '\n';
  std::lock_guard<std::mutex> lock(g_write_mu);
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr gone: logging must never take a process down
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace thermocline
