#include "shared/tokenizer/wordpiece.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/utf16.h>

#include <algorithm>

#include "shared/tokenizer/utf8.h"

namespace thermocline {

namespace {

// The first code point of cp's full canonical decomposition (llama.cpp's unicode_ranges_nfd).
UChar32 NfdFirst(UChar32 cp) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* nfd = unorm2_getNFDInstance(&err);
  if (U_FAILURE(err)) return cp;
  UChar buf[32];
  const int32_t n = unorm2_getDecomposition(nfd, cp, buf, 32, &err);
  if (U_FAILURE(err) || n <= 0) return cp;
  UChar32 first;
  int32_t i = 0;
  U16_NEXT(buf, i, n, first);
  return first;
}

bool IsChinese(UChar32 cp) {
  // BERT's ranges, with Hugging Face's 0x2B920 where the CJK extension starts at 0x2B820.
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

bool IsPunctuation(int8_t type) {
  switch (type) {
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_CONNECTOR_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

bool IsSymbol(int8_t type) {
  return type == U_MATH_SYMBOL || type == U_CURRENCY_SYMBOL || type == U_MODIFIER_SYMBOL ||
         type == U_OTHER_SYMBOL;
}

bool IsOther(int8_t type) {  // \p{C}: control, format, private use, surrogate, unassigned
  return type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_PRIVATE_USE_CHAR ||
         type == U_SURROGATE || type == U_UNASSIGNED;
}

}  // namespace

std::vector<std::string> WordPieceWords(std::string_view text) {
  const std::string valid = utf8::ReplaceInvalidBytes(text);
  std::vector<std::string> words(1);
  for (size_t i = 0; i < valid.size();) {
    const std::string_view rest = std::string_view(valid).substr(i);
    i += utf8::SymbolLength(rest);
    const UChar32 cp = NfdFirst(static_cast<UChar32>(utf8::Decode(rest)));
    if (u_isUWhiteSpace(cp)) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    const auto type = static_cast<int8_t>(u_charType(cp));
    if (cp == 0 || cp == 0xFFFD || IsOther(type)) continue;
    std::string s;
    utf8::AppendCodepoint(static_cast<uint32_t>(u_tolower(cp)), &s);
    if (IsPunctuation(type) || (cp < 0x7F && IsSymbol(type)) || IsChinese(cp)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = std::move(s);
      words.emplace_back();
    } else {
      words.back() += s;
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

void WordPieceEncodeWord(std::string_view word, size_t max_piece_bytes,
                         absl::FunctionRef<int32_t(std::string_view)> lookup, int32_t unk,
                         std::vector<int32_t>* out) {
  if (word.empty()) return;
  const std::string w = "\xE2\x96\x81" + std::string(word);
  const size_t start = out->size();
  for (size_t i = 0; i < w.size();) {
    bool matched = false;
    for (size_t j = std::min(w.size(), i + max_piece_bytes); j > i; --j) {
      const int32_t id = lookup(std::string_view(w).substr(i, j - i));
      if (id >= 0) {
        out->push_back(id);
        i = j;
        matched = true;
        break;
      }
    }
    if (!matched) {
      out->resize(start);
      break;
    }
  }
  if (out->size() == start) out->push_back(unk);
}

}  // namespace thermocline
