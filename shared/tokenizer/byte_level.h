// GPT-2's byte-level alphabet (bytes_to_unicode in OpenAI's encoder.py, which every `gpt2`
// GGUF vocabulary is written in): each of the 256 byte values stands for one printable code
// point, so BPE works on text with no raw control bytes or spaces in it. Printable Latin-1
// bytes map to themselves, the other 68 to U+0100.. in byte order (space is U+0120, 'Ġ').
#pragma once

#include <string>
#include <string_view>

namespace thermocline::byte_level {

// The alphabet's UTF-8 for every byte of `bytes`.
std::string Encode(std::string_view bytes);

// The bytes behind alphabet text. A code point outside the alphabet (which a well-formed
// vocabulary never holds in a normal token) is kept as its own UTF-8; llama.cpp writes an
// "[UNK_BYTE_0x..]" marker there instead.
std::string Decode(std::string_view text);

}  // namespace thermocline::byte_level
