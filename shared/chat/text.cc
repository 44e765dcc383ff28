#include "shared/chat/text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "unicode/ucasemap.h"
#include "unicode/uchar.h"

namespace thermocline::chat {

namespace {

// Decodes one code point at s[i]; advances i. Malformed sequences yield U+FFFD, one byte each.
char32_t DecodeOne(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) -> int {
    if (i + k >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[i + k]);
    return (b & 0xC0) == 0x80 ? (b & 0x3F) : -1;
  };
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = 0;
  char32_t c = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 1, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3, c = b0 & 0x07, min = 0x10000;
  } else {
    ++i;
    return 0xFFFD;
  }
  for (int k = 1; k <= n; ++k) {
    const int x = cont(static_cast<size_t>(k));
    if (x < 0) {
      ++i;
      return 0xFFFD;
    }
    c = (c << 6) | static_cast<char32_t>(x);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
    ++i;
    return 0xFFFD;
  }
  i += static_cast<size_t>(n) + 1;
  return c;
}

bool InChars(char32_t c, const std::vector<char32_t>& set) {
  for (char32_t x : set) {
    if (x == c) return true;
  }
  return false;
}

// Python's str.isprintable() is false for these (categories Cc, Cf, Cs, Co, Zl, Zp and Zs other
// than the space); unassigned code points are not tabled here and print as themselves.
bool IsNonPrintable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0)) return true;
  if (c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000 || c == 0xFEFF ||
      (c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD ||
      c == 0x70F || c == 0x180E || c == 0x110BD || (c >= 0x1D173 && c <= 0x1D17A) || c == 0xE0001 ||
      (c >= 0xE0020 && c <= 0xE007F)) {
    return true;
  }
  if (c >= 0xD800 && c <= 0xF8FF) return true;  // surrogates and the private use area
  if (c >= 0xF0000) return true;                // supplementary private use areas
  return false;
}

}  // namespace

std::vector<char32_t> DecodeUtf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(DecodeOne(s, i));
  return out;
}

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string EncodeUtf8(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) AppendUtf8(cps[i], out);
  return out;
}

size_t Utf8Length(std::string_view s) {
  size_t n = 0;
  size_t i = 0;
  while (i < s.size()) {
    DecodeOne(s, i);
    ++n;
  }
  return n;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t before = i;
    const char32_t c = DecodeOne(s, i);
    if (c == 0xFFFD) {
      // A literal U+FFFD is three bytes long; a decoding failure advances by one.
      if (i - before != 3) return false;
    }
  }
  return true;
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool IsPyLineBreak(char32_t c) {
  return (c >= 0x0A && c <= 0x0D) || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
         c == 0x2029;
}

std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  std::vector<char32_t> set;
  if (chars != nullptr) set = DecodeUtf8(*chars);
  auto strip_it = [&](char32_t c) { return chars == nullptr ? IsPySpace(c) : InChars(c, set); };
  size_t b = 0;
  size_t e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return EncodeUtf8(cps, b, e);
}

std::vector<std::string> PySplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep == nullptr) {
    const std::vector<char32_t> cps = DecodeUtf8(s);
    size_t i = 0;
    const size_t n = cps.size();
    while (i < n) {
      while (i < n && IsPySpace(cps[i])) ++i;
      if (i == n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = n;
        while (e > i && IsPySpace(cps[e - 1])) --e;
        out.push_back(EncodeUtf8(cps, i, e));
        break;
      }
      size_t j = i;
      while (j < n && !IsPySpace(cps[j])) ++j;
      out.push_back(EncodeUtf8(cps, i, j));
      i = j;
    }
    return out;
  }
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t p = s.find(*sep, start);
    if (p == std::string_view::npos) break;
    out.emplace_back(s.substr(start, p - start));
    start = p + sep->size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::vector<std::string> PyRSplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return PySplit(s, sep, maxsplit);
  std::vector<std::string> rev;
  if (sep == nullptr) {
    const std::vector<char32_t> cps = DecodeUtf8(s);
    size_t e = cps.size();
    while (e > 0) {
      while (e > 0 && IsPySpace(cps[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<int64_t>(rev.size()) == maxsplit) {
        size_t b = 0;
        while (b < e && IsPySpace(cps[b])) ++b;
        rev.push_back(EncodeUtf8(cps, b, e));
        break;
      }
      size_t j = e;
      while (j > 0 && !IsPySpace(cps[j - 1])) --j;
      rev.push_back(EncodeUtf8(cps, j, e));
      e = j;
    }
  } else {
    size_t end = s.size();
    while (static_cast<int64_t>(rev.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t p = s.rfind(*sep, end - sep->size());
      if (p == std::string_view::npos) break;
      rev.emplace_back(s.substr(p + sep->size(), end - p - sep->size()));
      end = p;
    }
    rev.emplace_back(s.substr(0, end));
  }
  return std::vector<std::string>(rev.rbegin(), rev.rend());
}

std::vector<std::string> PySplitLines(std::string_view s) {
  std::vector<std::string> out;
  const std::vector<char32_t> cps = DecodeUtf8(s);
  size_t start = 0;
  size_t i = 0;
  while (i < cps.size()) {
    if (IsPyLineBreak(cps[i])) {
      out.push_back(EncodeUtf8(cps, start, i));
      if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
      ++i;
      start = i;
    } else {
      ++i;
    }
  }
  if (start < cps.size()) out.push_back(EncodeUtf8(cps, start, cps.size()));
  return out;
}

std::string PyReplace(std::string_view s, std::string_view from, std::string_view to,
                      int64_t count) {
  std::string out;
  int64_t done = 0;
  if (from.empty()) {
    const std::vector<char32_t> cps = DecodeUtf8(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(to);
        ++done;
      }
      if (i < cps.size()) AppendUtf8(cps[i], out);
    }
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t p = s.find(from, start);
    if (p == std::string_view::npos) break;
    out.append(s.substr(start, p - start));
    out.append(to);
    start = p + from.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

namespace {

// ICU's root-locale full case mapping is Python's (language-independent SpecialCasing rules).
std::string IcuCaseMap(std::string_view s, bool upper) {
  UErrorCode status = U_ZERO_ERROR;
  UCaseMap* map = ucasemap_open("", U_FOLD_CASE_DEFAULT, &status);
  if (U_FAILURE(status)) return std::string(s);
  std::string out(s.size() + 16, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    status = U_ZERO_ERROR;
    const int32_t n = upper
                          ? ucasemap_utf8ToUpper(map, out.data(), static_cast<int32_t>(out.size()),
                                                 s.data(), static_cast<int32_t>(s.size()), &status)
                          : ucasemap_utf8ToLower(map, out.data(), static_cast<int32_t>(out.size()),
                                                 s.data(), static_cast<int32_t>(s.size()), &status);
    if (status == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(static_cast<size_t>(n), '\0');
      continue;
    }
    if (U_FAILURE(status)) break;
    out.resize(static_cast<size_t>(n));
    ucasemap_close(map);
    return out;
  }
  ucasemap_close(map);
  return std::string(s);
}

}  // namespace

std::string PyUpper(std::string_view s) { return IcuCaseMap(s, true); }
std::string PyLower(std::string_view s) { return IcuCaseMap(s, false); }

bool PyIsUpper(std::string_view s) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (u_isULowercase(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c))) return false;
    if (u_isUUppercase(static_cast<UChar32>(c))) cased = true;
  }
  return cased;
}

bool PyIsLower(std::string_view s) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (u_isUUppercase(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c))) return false;
    if (u_isULowercase(static_cast<UChar32>(c))) cased = true;
  }
  return cased;
}

namespace {

// Titlecase of one code point, full mapping (ǆ -> ǅ, ß -> Ss).
std::string TitleOne(char32_t c) {
  std::string in;
  AppendUtf8(c, in);
  UErrorCode status = U_ZERO_ERROR;
  UCaseMap* map =
      ucasemap_open("", U_TITLECASE_WHOLE_STRING | U_TITLECASE_NO_BREAK_ADJUSTMENT, &status);
  if (U_FAILURE(status)) return in;
  char buf[32];
  const int32_t n = ucasemap_utf8ToTitle(map, buf, sizeof buf, in.data(),
                                         static_cast<int32_t>(in.size()), &status);
  ucasemap_close(map);
  if (U_FAILURE(status) || n < 0 || n > static_cast<int32_t>(sizeof buf)) return in;
  return std::string(buf, static_cast<size_t>(n));
}

bool IsCased(char32_t c) {
  const auto u = static_cast<UChar32>(c);
  return u_isUUppercase(u) || u_isULowercase(u) || u_istitle(u);
}

}  // namespace

std::string PyTitle(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    std::string one;
    AppendUtf8(c, one);
    out += prev_cased ? PyLower(one) : TitleOne(c);
    prev_cased = IsCased(c);
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  if (cps.empty()) return "";
  return TitleOne(cps[0]) + PyLower(EncodeUtf8(cps, 1, cps.size()));
}

std::string PyStrRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (IsNonPrintable(c)) {
      char buf[16];
      if (c < 0x100) {
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      AppendUtf8(c, out);
    }
  }
  out.push_back(quote);
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string PyFloatRepr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  // Shortest round-trip digits, as Python's repr uses; then Python's layout rules.
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  if (!sci.empty() && sci[0] == '-') {
    out.push_back('-');
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int nd = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (nd > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    std::snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += buf;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= nd) {
    out += digits;
    out.append(static_cast<size_t>(decpt - nd), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decpt), std::string::npos);
  }
  return out;
}

}  // namespace thermocline::chat
