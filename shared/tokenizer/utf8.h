// UTF-8 as the tokenizers need it: well-formedness per Unicode 15 (table 3-7), sanitizing for
// output, and reading text as code points the way llama.cpp does before pre-tokenizing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace thermocline::utf8 {

// How the bytes at the start of `s` (non-empty) relate to UTF-8: `need` is the length of the
// sequence announced by the lead byte (0 for a byte that cannot start one) and `valid` how many
// leading bytes are consistent with a well-formed sequence (at least 1). The sequence is
// complete when valid == need; when valid < need and valid == s.size() it may still complete.
struct Prefix {
  size_t need;
  size_t valid;
};
Prefix Scan(std::string_view s);

// Appends the valid UTF-8 of `in` to `out`, replacing each maximal ill-formed subpart with one
// U+FFFD (Unicode's "substitution of maximal subparts", which gives the same text whether the
// bytes arrive at once or in pieces). Unless `final`, an incomplete sequence at the end is left
// unconsumed. Returns the number of bytes consumed.
size_t AppendSanitized(std::string_view in, bool final, std::string* out);

// Length of the character at s[0] (non-empty): a well-formed sequence, or 1 for an ill-formed
// byte.
size_t SymbolLength(std::string_view s);

// `s` with every byte that does not start a well-formed sequence replaced by U+FFFD: llama.cpp
// reads pre-tokenizer input this way (one U+FFFD per bad byte), and the regex engine needs
// valid UTF-8.
std::string ReplaceInvalidBytes(std::string_view s);

// The code point of the well-formed sequence at s[0] (as SymbolLength measures it).
uint32_t Decode(std::string_view s);
void AppendCodepoint(uint32_t cp, std::string* out);

}  // namespace thermocline::utf8
