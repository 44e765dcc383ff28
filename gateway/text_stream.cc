#include "gateway/text_stream.h"

#include <algorithm>
#include <utility>

namespace thermocline::gateway {
namespace {

bool IsContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

TextStream::TextStream(const Tokenizer& tok, std::vector<std::string> stop_strings)
    : detok_(tok) {
  for (std::string& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

bool TextStream::MatchStop(Delta* delta) {
  // Every occurrence that is not wholly in pending_ was ruled out earlier: released text never
  // holds the start of a stop string that could still complete (see ReleaseSafe).
  size_t best_end = std::string::npos, best_start = 0;
  const std::string* best = nullptr;
  for (const std::string& s : stops_) {
    const size_t pos = pending_.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (best == nullptr || end < best_end || (end == best_end && pos < best_start)) {
      best_end = end;
      best_start = pos;
      best = &s;
    }
  }
  if (best == nullptr) return false;
  delta->text = pending_.substr(0, best_start);
  delta->stopped = true;
  delta->matched = *best;
  stopped_ = true;
  matched_ = *best;
  pending_.clear();
  return true;
}

std::string TextStream::ReleaseSafe() {
  // The earliest position whose suffix is a proper prefix of some stop string: from there on
  // the text might still become a stop string; everything before it never can.
  size_t keep_from = pending_.size();
  for (size_t i = 0; i < pending_.size() && i < keep_from; ++i) {
    const std::string_view tail = std::string_view(pending_).substr(i);
    for (const std::string& s : stops_) {
      if (tail.size() < s.size() && std::string_view(s).substr(0, tail.size()) == tail) {
        keep_from = i;
        break;
      }
    }
  }
  // A stop string that starts inside a character (not valid UTF-8 on its own) must not make
  // the release cut that character.
  while (keep_from > 0 && keep_from < pending_.size() && IsContinuationByte(pending_[keep_from])) {
    --keep_from;
  }
  std::string out = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  return out;
}

TextStream::Delta TextStream::Push(int32_t token) {
  Delta delta;
  if (stopped_ || finished_) {
    delta.stopped = stopped_;
    delta.matched = matched_;
    return delta;
  }
  pending_ += detok_.Push(token);
  if (MatchStop(&delta)) return delta;
  delta.text = ReleaseSafe();
  return delta;
}

std::string TextStream::Finish() {
  if (stopped_ || finished_) return "";
  finished_ = true;
  pending_ += detok_.Flush();
  Delta delta;
  if (MatchStop(&delta)) return delta.text;
  return std::exchange(pending_, std::string());
}

}  // namespace thermocline::gateway
