#include "shared/tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "shared/tokenizer/utf8.h"

namespace thermocline::byte_level {

namespace {

struct Alphabet {
  std::array<uint32_t, 256> byte_to_cp;
  std::array<int16_t, 512> cp_to_byte;  // every code point of the alphabet is below U+0144

  Alphabet() {
    cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? b : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& GetAlphabet() {
  static const Alphabet* a = new Alphabet();
  return *a;
}

}  // namespace

std::string Encode(std::string_view bytes) {
  const Alphabet& a = GetAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::AppendCodepoint(a.byte_to_cp[static_cast<uint8_t>(c)], &out);
  return out;
}

std::string Decode(std::string_view text) {
  const Alphabet& a = GetAlphabet();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8::SymbolLength(text.substr(i));
    const uint32_t cp = utf8::Decode(text.substr(i));
    if (n > 1 || cp < 0x80) {
      if (cp < a.cp_to_byte.size() && a.cp_to_byte[cp] >= 0) {
        out.push_back(static_cast<char>(a.cp_to_byte[cp]));
      } else {
        out.append(text.substr(i, n));
      }
    } else {
      out.push_back(text[i]);  // an ill-formed byte: passed through, sanitized on output
    }
    i += n;
  }
  return out;
}

}  // namespace thermocline::byte_level
