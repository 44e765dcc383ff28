#include "shared/chat/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "shared/chat/text.h"
#include "shared/chat/value.h"

namespace thermocline::chat {

namespace {

// Jinja2 turns \r\n and \r into \n and drops one trailing newline before lexing.
std::string NormalizeNewlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' ||
         (c >= 0x1c && c <= 0x1f);
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      const size_t start = FindTagStart(pos_);
      if (start == std::string::npos) {
        EmitText(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      size_t after = start + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string text = src_.substr(pos_, start - pos_);
      const bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
      text = StripBeforeTag(std::move(text), sign, kind != '{', line_starting);
      EmitText(std::move(text), pos_);
      if (kind == '#') {
        LexComment(start, after);
      } else if (kind == '%' && LexRaw(start, after)) {
        // handled
      } else {
        LexTag(kind, start, after);
      }
    }
    Token eof;
    eof.type = TokenType::kEof;
    SetPos(eof, src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void Fail(size_t offset, const std::string& message) {
    TemplateError e(absl::StatusCode::kInvalidArgument, message);
    Token t;
    SetPos(t, offset);
    e.set_position(t.line, t.column);
    throw e;
  }

  void SetPos(Token& t, size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    t.line = static_cast<int>(line);
    t.column = static_cast<int>(offset - line_starts_[line - 1] + 1);
  }

  size_t FindTagStart(size_t from) const {
    size_t p = from;
    while (true) {
      p = src_.find('{', p);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      ++p;
    }
  }

  // `{%-` strips all whitespace before the tag; lstrip_blocks strips spaces and tabs between
  // the start of the line and a block or comment tag unless the tag says `+`.
  static std::string StripBeforeTag(std::string text, char sign, bool is_block_or_comment,
                                    bool line_starting) {
    if (sign == '-') return PyStrip(text, nullptr, false, true);
    if (sign == '+' || !is_block_or_comment) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos == text.size()) return text;
    const std::string_view tail(text.data() + l_pos, text.size() - l_pos);
    for (char32_t c : DecodeUtf8(tail)) {
      if (!IsPySpace(c)) return text;
    }
    text.resize(l_pos);
    return text;
  }

  void EmitText(std::string text, size_t offset) {
    if (text.empty()) return;
    Token t;
    t.type = TokenType::kText;
    t.text = std::move(text);
    SetPos(t, offset);
    tokens_.push_back(std::move(t));
  }

  // After `-%}`: skip all whitespace; after a plain `%}` (trim_blocks): one newline.
  size_t SkipAfterTag(size_t p, char sign, bool trim_newline) const {
    if (sign == '-') {
      while (p < src_.size()) {
        size_t q = p;
        const std::vector<char32_t> one =
            DecodeUtf8(std::string_view(src_).substr(p, std::min<size_t>(4, src_.size() - p)));
        if (one.empty() || !IsPySpace(one[0])) break;
        std::string enc;
        AppendUtf8(one[0], enc);
        q += enc.size();
        p = q;
      }
      return p;
    }
    if (sign == 0 && trim_newline && p < src_.size() && src_[p] == '\n') return p + 1;
    return p;
  }

  void LexComment(size_t start, size_t content) {
    size_t q = content;
    while (true) {
      q = src_.find("#}", q);
      if (q == std::string::npos) Fail(start, "missing end of comment tag");
      break;
    }
    char sign = 0;
    if (q > content && (src_[q - 1] == '-' || src_[q - 1] == '+')) sign = src_[q - 1];
    pos_ = SkipAfterTag(q + 2, sign, true);
  }

  // {% raw %} ... {% endraw %}: the text between is output as it is.
  bool LexRaw(size_t start, size_t after) {
    size_t p = after;
    while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && (IsNameStart(src_[p]) || IsDigit(src_[p]))) return false;
    while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p = SkipAfterTag(p + 3, '-', false);
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    // Find `{%[-+]? ws* endraw ws* [-+]?%}`.
    size_t q = p;
    while (true) {
      q = src_.find("{%", q);
      if (q == std::string::npos) Fail(start, "missing end of raw directive");
      size_t r = q + 2;
      char open_sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) open_sign = src_[r++];
      while (r < src_.size() && IsAsciiSpace(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) {
        q += 2;
        continue;
      }
      r += 6;
      while (r < src_.size() && IsAsciiSpace(src_[r])) ++r;
      char close_sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) close_sign = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) {
        q += 2;
        continue;
      }
      std::string text = src_.substr(p, q - p);
      const bool line_starting = p == 0 || src_[p - 1] == '\n';
      EmitText(StripBeforeTag(std::move(text), open_sign, true, line_starting), p);
      pos_ = SkipAfterTag(r + 2, close_sign, true);
      return true;
    }
  }

  void LexTag(char kind, size_t start, size_t p) {
    Token begin;
    begin.type = kind == '{' ? TokenType::kVarBegin : TokenType::kBlockBegin;
    SetPos(begin, start);
    tokens_.push_back(begin);
    std::vector<char> balance;
    while (true) {
      while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
      if (p >= src_.size()) {
        Fail(start, kind == '{' ? "unexpected end of template: '{{' is never closed by '}}'"
                                : "unexpected end of template: '{%' is never closed by '%}'");
      }
      if (balance.empty()) {
        const char* close = kind == '{' ? "}}" : "%}";
        char sign = 0;
        size_t q = p;
        if (src_[q] == '-' || (kind == '%' && src_[q] == '+')) sign = src_[q++];
        if (src_.compare(q, 2, close) == 0) {
          Token end;
          end.type = kind == '{' ? TokenType::kVarEnd : TokenType::kBlockEnd;
          SetPos(end, p);
          tokens_.push_back(end);
          pos_ = SkipAfterTag(q + 2, sign, kind == '%');
          return;
        }
      }
      p = LexExpressionToken(p, balance);
    }
  }

  size_t LexExpressionToken(size_t p, std::vector<char>& balance) {
    Token t;
    SetPos(t, p);
    const char c = src_[p];
    if (c == '\'' || c == '"') {
      size_t q = p + 1;
      while (q < src_.size() && src_[q] != c) {
        if (src_[q] == '\\') ++q;
        ++q;
      }
      if (q >= src_.size()) Fail(p, "unterminated string literal");
      t.type = TokenType::kString;
      t.text = Unescape(std::string_view(src_).substr(p + 1, q - p - 1), p);
      tokens_.push_back(std::move(t));
      return q + 1;
    }
    if (IsDigit(c)) return LexNumber(p, std::move(t));
    if (IsNameStart(c)) {
      size_t q = p;
      while (q < src_.size() && (IsNameStart(src_[q]) || IsDigit(src_[q]))) ++q;
      t.type = TokenType::kName;
      t.text = src_.substr(p, q - p);
      tokens_.push_back(std::move(t));
      return q;
    }
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (src_.compare(p, 2, op) == 0) {
        PushOp(p, std::string_view(op, 2));
        return p + 2;
      }
    }
    static const std::string_view kOne = "+-/*%~[](){}><=.:|,;";
    if (kOne.find(c) == std::string_view::npos) {
      const auto b = static_cast<unsigned char>(c);
      Fail(p, b < 0x80 && b >= 0x20 ? std::string("unexpected char '") + c + "'"
                                    : "unexpected character in a tag");
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) Fail(p, std::string("unexpected '") + c + "'");
      if (balance.back() != c) {
        Fail(p, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
      }
      balance.pop_back();
    }
    PushOp(p, std::string_view(&src_[p], 1));
    return p + 1;
  }

  void PushOp(size_t p, std::string_view op) {
    tokens_.emplace_back();
    Token& t = tokens_.back();
    t.type = TokenType::kOp;
    t.text = std::string(op);
    SetPos(t, p);
  }

  size_t Digits(size_t q) const {
    // digits with single underscores between them
    if (q >= src_.size() || !IsDigit(src_[q])) return q;
    while (q < src_.size()) {
      if (IsDigit(src_[q])) {
        ++q;
      } else if (src_[q] == '_' && q + 1 < src_.size() && IsDigit(src_[q + 1])) {
        ++q;
      } else {
        break;
      }
    }
    return q;
  }

  size_t LexNumber(size_t p, Token t) {
    size_t q = Digits(p);
    bool is_float = false;
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    if (!after_dot) {
      size_t r = q;
      if (r + 1 < src_.size() && src_[r] == '.' && IsDigit(src_[r + 1])) {
        r = Digits(r + 1);
        is_float = true;
      }
      if (r < src_.size() && (src_[r] == 'e' || src_[r] == 'E')) {
        size_t s = r + 1;
        if (s < src_.size() && (src_[s] == '+' || src_[s] == '-')) ++s;
        if (s < src_.size() && IsDigit(src_[s])) {
          r = Digits(s);
          is_float = true;
        }
      }
      if (is_float) q = r;
    }
    std::string digits;
    for (size_t i = p; i < q; ++i) {
      if (src_[i] != '_') digits.push_back(src_[i]);
    }
    if (is_float) {
      t.type = TokenType::kFloat;
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      t.type = TokenType::kInt;
      errno = 0;
      const long long v = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) Fail(p, "integer literal out of range");
      t.int_value = v;
    }
    t.text = std::move(digits);
    tokens_.push_back(std::move(t));
    return q;
  }

  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python's unicode-escape decoding of a string literal's body: unknown escapes stay as they
  // are (backslash included).
  std::string Unescape(std::string_view s, size_t offset) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '\\' || i + 1 >= s.size()) {
        out.push_back(s[i]);
        continue;
      }
      const char e = s[++i];
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const int h = i + 1 + k < s.size() ? HexValue(s[i + 1 + k]) : -1;
            if (h < 0) Fail(offset, std::string("truncated \\") + e + " escape in a string");
            cp = cp * 16 + static_cast<char32_t>(h);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            Fail(offset, "escape in a string is not a valid code point");
          }
          AppendUtf8(cp, out);
          i += n;
          break;
        }
        case 'N':
          Fail(offset, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(s[++i] - '0');
            }
            AppendUtf8(cp, out);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    return out;
  }

  std::string src_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source) {
  if (!IsValidUtf8(source)) {
    throw TemplateError(absl::StatusCode::kInvalidArgument, "template is not valid UTF-8");
  }
  return Lexer(NormalizeNewlines(source)).Run();
}

}  // namespace thermocline::chat
