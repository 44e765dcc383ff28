// Progress with ETA on stderr for long offline work (profile, train-predictor, perplexity, synth).
// On a terminal the line redraws in place a few times a second; otherwise (CI logs, pipes) a line
// is printed at every 10% so logs stay short.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace thermocline {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit = "");
  ~ProgressBar();  // finishes the line if Finish was not called
  // `done` counts units completed so far; `note` is extra text shown after the counts.
  void Update(int64_t done, const std::string& note = "");
  void Finish(const std::string& note = "");

 private:
  void Draw(int64_t done, const std::string& note, bool final_line);

  std::string label_, unit_;
  int64_t total_;
  bool tty_, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace thermocline
