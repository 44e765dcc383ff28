// Builds the syntax tree of a chat template from its tokens, following Jinja2's grammar and
// operator precedence. Like Jinja2, an unknown filter or test is an error when the template is
// parsed, even in a branch that never runs.
#pragma once

#include <string_view>

#include "shared/chat/ast.h"

namespace thermocline::chat {

// Nesting (brackets, operators, blocks) deeper than this is refused: the parser and the
// renderer recurse over it.
inline constexpr int kMaxParseDepth = 200;

// Throws TemplateError with the position of the offending token.
Body ParseTemplate(std::string_view source);

}  // namespace thermocline::chat
