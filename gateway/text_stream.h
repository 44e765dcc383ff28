// The text side of one generation stream: token ids in, text that is safe to send out.
//
// Safe means two things. It is valid UTF-8: bytes of a character split over tokens (byte
// fallback) are held until the character completes (StreamingDetokenizer). And it never shows
// any part of a stop string: text that could still turn out to be the start of a stop string is
// held back until the next tokens decide, so a client never sees text the stop would have cut.
//
// Which stop wins: the occurrence (of any stop string) that ends first in the decoded text;
// among those ending at the same place, the one that starts first (the longest). That is the
// occurrence a brute-force scan of the whole text picks with the same rule, however the text is
// cut into tokens, because every occurrence completes at some token and is seen right then.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/tokenizer/tokenizer.h"

namespace thermocline::gateway {

class TextStream {
 public:
  // `tok` must outlive the stream. Empty stop strings are ignored (they would match
  // everywhere); the gateway's validation refuses them before this.
  TextStream(const Tokenizer& tok, std::vector<std::string> stop_strings);

  struct Delta {
    std::string text;     // safe to send now (possibly empty)
    bool stopped = false; // a stop string completed: `text` ends right before it
    std::string matched;  // the stop string, when stopped
  };

  // Appends token `token`'s text. Once stopped, further pushes are no-ops that return an empty
  // Delta with stopped = true and the same `matched` (the caller should have ended the
  // sequence; a late token must not leak text past the stop).
  Delta Push(int32_t token);

  // The end of the stream (EOS, length, cancellation): everything still held back, with U+FFFD
  // for an unfinished character. A stop string completed only by that last flush still stops
  // (stopped() turns true and the text ends before it). "" after a stop.
  std::string Finish();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  // Looks for the winning stop occurrence in pending_; on one, fills `delta` and returns true.
  bool MatchStop(Delta* delta);
  // Releases the part of pending_ that cannot become a stop string.
  std::string ReleaseSafe();

  StreamingDetokenizer detok_;
  std::vector<std::string> stops_;
  std::string pending_;  // decoded, not yet released (valid UTF-8)
  bool stopped_ = false;
  bool finished_ = false;
  std::string matched_;
};

}  // namespace thermocline::gateway
