// Between JSON and template values: the messages and tools a request brings in, and the
// `tojson` filter, which Hugging Face defines as Python's json.dumps(value, ensure_ascii=False,
// indent=indent).
#pragma once

#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "shared/chat/value.h"

namespace thermocline::chat {

// Throws TemplateError for JSON nested deeper than kMaxValueDepth or an integer beyond int64.
Value FromJson(const nlohmann::ordered_json& j);

// json.dumps(v, ensure_ascii=False, indent=indent): with no indent "a, b" and "k: v"
// separators; with one, newlines and `indent` spaces per level. Throws TemplateError for values
// JSON cannot hold (undefined, namespace, function, generator).
std::string ToJson(const Value& v, std::optional<std::string> indent);

}  // namespace thermocline::chat
