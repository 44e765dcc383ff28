// Python's operators over template values: arithmetic, `in`, and comparison chains, raising
// TypeError-like errors where Python does (and where Python would grow an integer past 64 bits).
#pragma once

#include <string_view>

#include "shared/chat/value.h"

namespace thermocline::chat {

class Interpreter;

// op is one of + - * / // % **.
Value BinaryOp(Interpreter& interp, std::string_view op, const Value& a, const Value& b);
Value Negate(const Value& v);
// `item in container`.
bool Contains(const Value& container, const Value& item);
// op is one of == != < > <= >= in notin.
bool CompareOp(std::string_view op, const Value& a, const Value& b);

}  // namespace thermocline::chat
