#include "shared/util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace thermocline {
namespace {
std::string FormatSeconds(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600,
                  (static_cast<int>(s) / 60) % 60);
  }
  return buf;
}
}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(1, total)),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (!finished_) Finish();
}

void ProgressBar::Update(int64_t done, const std::string& note) {
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(200)) return;
  } else {
    const int decile = static_cast<int>(10 * std::min(done, total_) / total_);
    if (decile == last_decile_) return;
    last_decile_ = decile;
  }
  last_draw_ = now;
  Draw(done, note, false);
}

void ProgressBar::Finish(const std::string& note) {
  finished_ = true;
  Draw(total_, note, true);
}

void ProgressBar::Draw(int64_t done, const std::string& note, bool final_line) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = std::min(1.0, static_cast<double>(done) / total_);
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::string eta = final_line ? "done in " + FormatSeconds(elapsed)
                               : (done > 0 ? "ETA " + FormatSeconds(elapsed * (1 - frac) / frac)
                                           : "ETA ?");
  std::fprintf(stderr, "%s%s [%s] %3.0f%% %lld/%lld%s%s %s%s%s", tty_ ? "\r\033[K" : "", label_.c_str(),
               bar.c_str(), 100 * frac, static_cast<long long>(done),
               static_cast<long long>(total_), unit_.empty() ? "" : " ", unit_.c_str(),
               eta.c_str(), note.empty() ? "" : "  ", note.c_str());
  std::fprintf(stderr, "%s", (!tty_ || final_line) ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace thermocline
