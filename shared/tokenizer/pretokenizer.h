// BPE pre-tokenization: splitting text into the words that BPE merges within, by the regexes
// llama.cpp applies for each `tokenizer.ggml.pre` name (src/llama-vocab.cpp), run by PCRE2 with
// UTF and Unicode properties (UCP). Each regex of a list splits every piece the previous one
// produced; both the matches and the text between them become pieces, and lookahead never
// sees past its piece (llama.cpp's unicode_regex_split). llama.cpp runs the common patterns
// (gpt-2, llama3, qwen2) through hand-written equivalents and the rest through std::regex on
// text whose non-ASCII code points are collapsed to one byte per Unicode category; the patterns
// here are the ones whose PCRE2 behaviour equals that (e.g. tekken's "letter not a-z" classes,
// which is what the collapsing makes of \p{Lu} / \p{Ll}), checked by llama.cpp's test vectors.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline {

class Pretokenizer {
 public:
  // `pre` as in tokenizer.ggml.pre; "" (the key is missing) means "default", as in llama.cpp.
  // An unknown name is an InvalidArgument error naming it and every known name.
  static absl::StatusOr<std::shared_ptr<const Pretokenizer>> ForName(std::string_view pre);
  // Every accepted name, for error messages and documentation.
  static std::vector<std::string_view> KnownNames();

  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // The words of `text`, which must be valid UTF-8 (utf8::ReplaceInvalidBytes), as views into
  // it, in order, covering it exactly. Thread-safe.
  std::vector<std::string_view> Split(std::string_view text) const;

  const std::string& name() const { return name_; }
  // llama.cpp's per-name defaults: a word that is a whole vocabulary token skips merging
  // (llama3, tekken), and BOS is added unless tokenizer.ggml.add_bos_token says otherwise.
  bool ignore_merges() const { return ignore_merges_; }
  bool add_bos_default() const { return add_bos_; }
  // Whether llama.cpp's detokenizer cleans up spaces for this name (CleanUpTokenizationSpaces).
  bool clean_spaces() const { return clean_spaces_; }

 private:
  struct Regex;
  Pretokenizer() = default;

  std::string name_;
  bool ignore_merges_ = false;
  bool add_bos_ = false;
  bool clean_spaces_ = true;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace thermocline
