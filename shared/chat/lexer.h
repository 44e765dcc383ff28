// Splits a chat template into tokens the way Jinja2's lexer does with Hugging Face's settings
// (trim_blocks, lstrip_blocks, keep_trailing_newline off): whitespace control (`{%-`, `-%}`,
// `+%}`...) is resolved here, so text tokens hold exactly the text to output.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace thermocline::chat {

enum class TokenType {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;  // text, name, operator, or the unescaped string literal
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

// Throws TemplateError (with the position) on a malformed template: an unclosed tag, comment or
// string, an unknown character, unbalanced brackets.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace thermocline::chat
