// Jinja2's filters, tests, global functions and the attribute/item lookups (with the str and
// dict methods templates call), as Hugging Face's sandboxed environment provides them.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shared/chat/value.h"

namespace thermocline::chat {

class Interpreter;

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);
Value ApplyFilter(Interpreter& interp, const std::string& name, const Value& subject,
                  const CallArgs& args);
bool ApplyTest(Interpreter& interp, const std::string& name, const Value& subject,
               const CallArgs& args);

// `obj.name`: an attribute (a method) first, then an item, as Jinja2's getattr.
Value GetAttribute(const Value& obj, const std::string& name);
// `obj[key]`: an item first, then an attribute for a string key, as Jinja2's getitem.
Value GetItem(const Value& obj, const Value& key);
// `obj[start:stop:step]` (undefined parts are None).
Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Items of an iterable (list, tuple, string, dict keys; undefined: none), or a TypeError.
std::vector<Value> Iterate(const Value& v);

// range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> GlobalFunctions();

}  // namespace thermocline::chat
