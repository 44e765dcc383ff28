// Byte-pair merging within one pre-tokenized word, by the merge ranks of
// tokenizer.ggml.merges ("left right", lower index = merged first), as llama.cpp's
// llm_tokenizer_bpe_session does: start from single characters, repeatedly merge the adjacent
// pair of lowest rank (leftmost on ties) until no pair has a rank.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace thermocline {

class BpeMerges {
 public:
  // Each entry must be two non-empty pieces separated by a space (split at the first space
  // after the first character, as llama.cpp does); anything else is an InvalidArgument error
  // naming the entry. A repeated pair keeps its first (lowest) rank.
  static absl::StatusOr<BpeMerges> FromStrings(const std::vector<std::string>& merges);

  // Rank of merging `left` with `right`, or -1.
  int32_t Rank(std::string_view left, std::string_view right) const;
  size_t size() const { return ranks_.size(); }

  // The symbols `word` merges into, as views into it, in order.
  std::vector<std::string_view> Merge(std::string_view word) const;

 private:
  absl::flat_hash_map<std::string, int32_t> ranks_;  // key: left + '\xFF' + right
};

}  // namespace thermocline
