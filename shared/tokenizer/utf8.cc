#include "shared/tokenizer/utf8.h"

namespace thermocline::utf8 {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}  // namespace

Prefix Scan(std::string_view s) {
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return {1, 1};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {0, 1};
  }
  size_t valid = 1;
  while (valid < need && valid < s.size()) {
    const auto b = static_cast<uint8_t>(s[valid]);
    if (b < (valid == 1 ? lo : 0x80) || b > (valid == 1 ? hi : 0xBF)) break;
    ++valid;
  }
  return {need, valid};
}

size_t AppendSanitized(std::string_view in, bool final, std::string* out) {
  size_t i = 0;
  while (i < in.size()) {
    const Prefix p = Scan(in.substr(i));
    if (p.valid == p.need) {
      out->append(in.data() + i, p.need);
    } else if (!final && p.need > 0 && i + p.valid == in.size()) {
      break;
    } else {
      out->append(kReplacement);
    }
    i += p.valid;
  }
  return i;
}

size_t SymbolLength(std::string_view s) {
  const Prefix p = Scan(s);
  return p.valid == p.need ? p.need : 1;
}

std::string ReplaceInvalidBytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Prefix p = Scan(s.substr(i));
    if (p.valid == p.need) {
      out.append(s.data() + i, p.need);
      i += p.need;
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  return out;
}

uint32_t Decode(std::string_view s) {
  const auto b0 = static_cast<uint8_t>(s[0]);
  const size_t n = SymbolLength(s);
  if (n == 1) return b0;
  uint32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[k]) & 0x3F);
  return cp;
}

void AppendCodepoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace thermocline::utf8
