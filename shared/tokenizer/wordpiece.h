// WordPiece (`tokenizer.ggml.model = bert`) as llama.cpp's llm_tokenizer_wpm does it: text is
// read as code points, each replaced by the first code point of its NFD decomposition (which
// strips accents) and lower-cased; whitespace separates words; punctuation, ASCII symbols and
// CJK ideographs are words of their own; control characters, NUL and U+FFFD are dropped. Each
// word is then covered greedily by the longest vocabulary pieces, the first one prefixed with
// U+2581 (llama.cpp's conversion writes word-initial pieces so and "##" continuations bare); a
// word that cannot be covered becomes the unknown token. Unicode data comes from ICU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"

namespace thermocline {

// The normalized words of `text` (any bytes; invalid UTF-8 reads as U+FFFD).
std::vector<std::string> WordPieceWords(std::string_view text);

// Appends the ids covering "\u2581" + `word`: at each position the longest piece (of at most
// `max_piece_bytes` bytes) that `lookup` knows (lookup returns -1 for none); `unk` when some
// position has none.
void WordPieceEncodeWord(std::string_view word, size_t max_piece_bytes,
                         absl::FunctionRef<int32_t(std::string_view)> lookup, int32_t unk,
                         std::vector<int32_t>* out);

}  // namespace thermocline
