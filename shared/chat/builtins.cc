#include "shared/chat/builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <initializer_list>
#include <map>

#include "absl/strings/str_cat.h"
#include "shared/chat/interpreter.h"
#include "shared/chat/json_value.h"
#include "shared/chat/operators.h"
#include "shared/chat/text.h"

namespace thermocline::chat {

namespace {

// Binds a call's arguments to named parameters the way a Python signature does.
class Params {
 public:
  Params(const std::string& fn, const CallArgs& args, std::initializer_list<const char*> names)
      : fn_(fn), names_(names), vals_(names.size(), nullptr) {
    if (args.positional.size() > names_.size()) {
      ThrowError(fn + "() takes at most " + std::to_string(names_.size()) + " argument(s), " +
                 std::to_string(args.positional.size()) + " given");
    }
    for (size_t i = 0; i < args.positional.size(); ++i) vals_[i] = &args.positional[i];
    for (const auto& [k, v] : args.keyword) {
      size_t i = 0;
      while (i < names_.size() && k != names_[i]) ++i;
      if (i == names_.size()) ThrowError(fn + "() got an unexpected keyword argument '" + k + "'");
      if (vals_[i] != nullptr) ThrowError(fn + "() got multiple values for argument '" + k + "'");
      vals_[i] = &v;
    }
  }
  const Value* Get(size_t i) const { return vals_[i]; }
  Value Or(size_t i, Value def) const { return vals_[i] != nullptr ? *vals_[i] : def; }
  const Value& Required(size_t i) const {
    if (vals_[i] == nullptr) {
      ThrowError(fn_ + "() missing required argument '" + std::string(names_[i]) + "'");
    }
    return *vals_[i];
  }
  int64_t IntOr(size_t i, int64_t def) const {
    if (vals_[i] == nullptr || vals_[i]->is_none()) return def;
    if (!vals_[i]->is_integer_like()) {
      ThrowError(fn_ + "(): '" + names_[i] + "' must be an integer, not " + TypeName(*vals_[i]));
    }
    return vals_[i]->as_int();
  }
  bool BoolOr(size_t i, bool def) const { return vals_[i] != nullptr ? Truthy(*vals_[i]) : def; }

 private:
  std::string fn_;
  std::vector<const char*> names_;
  std::vector<const Value*> vals_;
};

const std::string& StrArg(const std::string& fn, const Value& v) {
  if (!v.is_string()) ThrowError(fn + "() argument must be str, not " + TypeName(v));
  return v.as_string();
}

// ---- attribute lookup: methods of str, dict and list ----

class BoundMethod : public Callable {
 public:
  BoundMethod(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  Value Call(Interpreter& interp, const CallArgs& args) const override;

 private:
  Value self_;
  std::string name_;
};

bool IsStrMethod(std::string_view n) {
  static const char* const kNames[] = {"strip",      "lstrip",     "rstrip",  "split",   "rsplit",
                                       "startswith", "endswith",   "upper",   "lower",   "replace",
                                       "title",      "capitalize", "find",    "rfind",   "count",
                                       "join",       "splitlines", "isdigit", "isalpha", "isalnum",
                                       "isspace",    "isupper",    "islower"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

bool IsDictMethod(std::string_view n) {
  return n == "items" || n == "keys" || n == "values" || n == "get";
}

// The sandbox refuses methods that mutate a list or dict.
bool IsUnsafeMethod(const Value& obj, std::string_view n) {
  if (obj.kind() == Value::Kind::kObject) {
    return n == "pop" || n == "popitem" || n == "setdefault" || n == "update" || n == "clear";
  }
  if (obj.kind() == Value::Kind::kArray && !obj.as_array().is_tuple) {
    return n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" ||
           n == "reverse" || n == "sort" || n == "clear";
  }
  return false;
}

std::string ObjectDesc(const Value& v) {
  if (v.is_none()) return "None";
  return absl::StrCat("\'", TypeName(v), " object'");
}

Value MethodOrUndefined(const Value& obj, const std::string& name) {
  const bool method = (obj.is_string() && IsStrMethod(name)) ||
                      (obj.kind() == Value::Kind::kObject && IsDictMethod(name)) ||
                      (obj.kind() == Value::Kind::kArray && !obj.is_generator() &&
                       (name == "index" || name == "count"));
  if (method) return Value::Func(std::make_shared<BoundMethod>(obj, name));
  if (IsUnsafeMethod(obj, name)) {
    return Value::Undefined("access to attribute '" + name + "' of " + ObjectDesc(obj) +
                            " is unsafe");
  }
  return Value::Undefined(ObjectDesc(obj) + " has no attribute '" + name + "'");
}

int64_t PyIndex(int64_t i, size_t n) { return i < 0 ? i + static_cast<int64_t>(n) : i; }

Value StrMethod(Interpreter& interp, const std::string& s, const std::string& name,
                const CallArgs& args) {
  const std::string fn = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p(fn, args, {"chars"});
    const Value chars = p.Or(0, Value::None());
    const std::string* set = chars.is_none() ? nullptr : &StrArg(fn, chars);
    return Value::Str(PyStrip(s, set, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Params p(fn, args, {"sep", "maxsplit"});
    const Value sep = p.Or(0, Value::None());
    const std::string* sp = sep.is_none() ? nullptr : &StrArg(fn, sep);
    if (sp != nullptr && sp->empty()) ThrowError(fn + "(): empty separator");
    const int64_t maxsplit = p.IntOr(1, -1);
    std::vector<std::string> parts =
        name == "split" ? PySplit(s, sp, maxsplit) : PyRSplit(s, sp, maxsplit);
    interp.Step(static_cast<int64_t>(parts.size()));
    std::vector<Value> items;
    for (std::string& x : parts) items.push_back(Value::Str(std::move(x)));
    return Value::List(std::move(items));
  }
  if (name == "startswith" || name == "endswith") {
    Params p(fn, args, {"prefix"});
    const Value& arg = p.Required(0);
    std::vector<std::string> options;
    if (arg.kind() == Value::Kind::kArray && arg.as_array().is_tuple) {
      for (const Value& x : arg.as_array().items) options.push_back(StrArg(fn, x));
    } else {
      options.push_back(StrArg(fn, arg));
    }
    for (const std::string& o : options) {
      if (o.size() > s.size()) continue;
      if (name == "startswith" ? s.compare(0, o.size(), o) == 0
                               : s.compare(s.size() - o.size(), o.size(), o) == 0) {
        return Value::Bool(true);
      }
    }
    return Value::Bool(false);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "splitlines" || name.rfind("is", 0) == 0) {
    Params p(fn, args, {});
    if (name == "upper") return Value::Str(PyUpper(s));
    if (name == "lower") return Value::Str(PyLower(s));
    if (name == "isupper") return Value::Bool(PyIsUpper(s));
    if (name == "islower") return Value::Bool(PyIsLower(s));
    if (name == "title") return Value::Str(PyTitle(s));
    if (name == "capitalize") return Value::Str(PyCapitalize(s));
    if (name == "splitlines") {
      std::vector<Value> items;
      for (std::string& x : PySplitLines(s)) items.push_back(Value::Str(std::move(x)));
      return Value::List(std::move(items));
    }
    const std::vector<char32_t> cps = DecodeUtf8(s);
    if (cps.empty()) return Value::Bool(false);
    bool all = true;
    for (char32_t c : cps) {
      const bool digit = c >= '0' && c <= '9';
      const bool up = c >= 'A' && c <= 'Z';
      const bool low = c >= 'a' && c <= 'z';
      if (name == "isdigit") all &= digit;
      if (name == "isalpha") all &= up || low;
      if (name == "isalnum") all &= up || low || digit;
      if (name == "isspace") all &= IsPySpace(c);
    }
    return Value::Bool(all);
  }
  if (name == "replace") {
    Params p(fn, args, {"old", "new", "count"});
    const std::string& from = StrArg(fn, p.Required(0));
    const std::string& to = StrArg(fn, p.Required(1));
    const int64_t count = p.IntOr(2, -1);
    const size_t n = from.empty() ? Utf8Length(s) + 1 : s.size() / from.size() + 1;
    if (!to.empty() && n > kMaxStringBytes / to.size()) CheckStringSize(kMaxStringBytes + 1);
    return Value::Str(PyReplace(s, from, to, count));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    Params p(fn, args, {"sub"});
    const std::string& sub = StrArg(fn, p.Required(0));
    if (name == "count") {
      if (sub.empty()) return Value::Int(static_cast<int64_t>(Utf8Length(s)) + 1);
      int64_t n = 0;
      for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size()))
        ++n;
      return Value::Int(n);
    }
    const size_t pos = name == "find" ? s.find(sub) : s.rfind(sub);
    if (pos == std::string::npos) return Value::Int(-1);
    return Value::Int(static_cast<int64_t>(Utf8Length(std::string_view(s).substr(0, pos))));
  }
  if (name == "join") {
    Params p(fn, args, {"iterable"});
    std::string out;
    size_t i = 0;
    for (const Value& x : Iterate(p.Required(0))) {
      if (!x.is_string()) {
        ThrowError("sequence item " + std::to_string(i) + ": expected str instance, " +
                   TypeName(x) + " found");
      }
      if (i++ > 0) out += s;
      out += x.as_string();
      CheckStringSize(out.size());
    }
    interp.Step(static_cast<int64_t>(i));
    return Value::Str(std::move(out));
  }
  ThrowError("'str object' has no attribute '" + name + "'");
}

Value BoundMethod::Call(Interpreter& interp, const CallArgs& args) const {
  const std::string fn = TypeName(self_) + "." + name_;
  if (self_.is_string()) return StrMethod(interp, self_.as_string(), name_, args);
  if (self_.kind() == Value::Kind::kObject) {
    const Object& o = self_.as_object();
    if (name_ == "get") {
      Params p(fn, args, {"key", "default"});
      const Value& key = p.Required(0);
      const Value* v = key.is_string() ? o.Find(key.as_string()) : nullptr;
      return v != nullptr ? *v : p.Or(1, Value::None());
    }
    Params p(fn, args, {});
    std::vector<Value> items;
    interp.Step(static_cast<int64_t>(o.items.size()));
    for (const auto& [k, v] : o.items) {
      if (name_ == "keys") {
        items.push_back(Value::Str(k));
      } else if (name_ == "values") {
        items.push_back(v);
      } else {
        items.push_back(Value::List({Value::Str(k), v}, true));
      }
    }
    return Value::DictView(name_ == "keys"     ? "dict_keys"
                           : name_ == "values" ? "dict_values"
                                               : "dict_items",
                           std::move(items));
  }
  const Array& a = self_.as_array();
  Params p(fn, args, {"value"});
  const Value& x = p.Required(0);
  int64_t count = 0;
  for (size_t i = 0; i < a.items.size(); ++i) {
    if (Equal(a.items[i], x)) {
      if (name_ == "index") return Value::Int(static_cast<int64_t>(i));
      ++count;
    }
  }
  if (name_ == "index") ThrowError(Repr(x) + " is not in list");
  return Value::Int(count);
}

// ---- filters ----

size_t Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return Utf8Length(v.as_string());
    case Value::Kind::kArray:
      if (!v.is_generator()) return v.as_array().items.size();
      break;
    case Value::Kind::kObject:
      return v.as_object().items.size();
    default:
      break;
  }
  ThrowError("object of type '" + TypeName(v) + "' has no len()");
}

// Jinja2's attribute getter for map/selectattr/join/sort: "a.b" or "0" paths, item lookups.
Value GetPath(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return GetItem(item, attribute);
  static const std::string kDot = ".";
  Value v = item;
  for (const std::string& part : PySplit(attribute.as_string(), &kDot, -1)) {
    bool digits = !part.empty();
    for (char c : part) digits &= c >= '0' && c <= '9';
    v = digits && part.size() < 18 ? GetItem(v, Value::Int(std::strtoll(part.c_str(), nullptr, 10)))
                                   : GetItem(v, Value::Str(part));
  }
  return v;
}

Value LowerIfString(const Value& v) {
  return v.is_string() ? Value::Str(PyLower(v.as_string())) : v;
}

std::string IndentText(const std::string& s, const std::string& indention, bool first, bool blank) {
  const std::vector<std::string> lines = PySplitLines(s + "\n");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
      CheckStringSize(rv.size());
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

// Python's int(str) / float(str): surrounding whitespace and '_' between digits allowed.
bool ParseInt(const std::string& text, int64_t base, int64_t& out) {
  std::string s = PyStrip(text, nullptr, true, true);
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() &&
        std::isalnum(static_cast<unsigned char>(s[i - 1])) &&
        std::isalnum(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    digits.push_back(s[i]);
  }
  if (digits.empty() || base < 2 || base > 36) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (errno != 0 || end == digits.c_str() || *end != '\0') return false;
  if (digits[0] == ' ' || digits.find_first_of("xX") != std::string::npos) return false;
  out = v;
  return true;
}

bool ParseFloat(const std::string& text, double& out) {
  std::string s = PyStrip(text, nullptr, true, true);
  if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0') return false;
  out = v;
  return true;
}

std::vector<Value> SortedItems(std::vector<Value> items, bool reverse, bool case_sensitive,
                               const Value* attribute) {
  auto key = [&](const Value& v) {
    Value k = attribute != nullptr && !attribute->is_none() ? GetPath(v, *attribute) : v;
    return case_sensitive ? k : LowerIfString(k);
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& v : items) keyed.emplace_back(key(v), std::move(v));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? Less(b.first, a.first) : Less(a.first, b.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

Value SelectOrReject(Interpreter& interp, const Value& seq, const CallArgs& args, bool select,
                     bool by_attr, const std::string& fn) {
  std::vector<Value> out;
  if (!Truthy(seq)) return Value::Generator({});
  size_t off = 0;
  Value attr;
  if (by_attr) {
    if (args.positional.empty()) ThrowError(fn + ": missing the attribute name");
    attr = args.positional[0];
    off = 1;
  }
  std::string test;
  CallArgs test_args;
  const bool has_test = args.positional.size() > off;
  if (has_test) {
    if (!args.positional[off].is_string()) ThrowError(fn + ": the test name must be a string");
    test = args.positional[off].as_string();
    if (!IsKnownTest(test)) ThrowError("no test named '" + test + "'");
    test_args.positional.assign(args.positional.begin() + static_cast<long>(off) + 1,
                                args.positional.end());
    test_args.keyword = args.keyword;
  }
  for (const Value& item : Iterate(seq)) {
    interp.Step();
    const Value subject = by_attr ? GetPath(item, attr) : item;
    const bool ok = has_test ? ApplyTest(interp, test, subject, test_args) : Truthy(subject);
    if (ok == select) out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

Value MapFilter(Interpreter& interp, const Value& seq, const CallArgs& args) {
  if (!Truthy(seq)) return Value::Generator({});
  std::vector<Value> out;
  if (args.positional.empty()) {
    const Value* attribute = nullptr;
    const Value* def = nullptr;
    for (const auto& [k, v] : args.keyword) {
      if (k == "attribute") {
        attribute = &v;
      } else if (k == "default") {
        def = &v;
      } else {
        ThrowError("map: unexpected keyword argument '" + k + "'");
      }
    }
    if (attribute == nullptr) ThrowError("map requires a filter argument");
    for (const Value& item : Iterate(seq)) {
      interp.Step();
      Value v = GetPath(item, *attribute);
      if (def != nullptr && !def->is_none() && v.is_undefined()) v = *def;
      out.push_back(std::move(v));
    }
    return Value::Generator(std::move(out));
  }
  if (!args.positional[0].is_string()) ThrowError("map: the filter name must be a string");
  const std::string name = args.positional[0].as_string();
  if (!IsKnownFilter(name)) ThrowError("no filter named '" + name + "'");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : Iterate(seq)) {
    interp.Step();
    out.push_back(ApplyFilter(interp, name, item, rest));
  }
  return Value::Generator(std::move(out));
}

Value MinMax(const Value& seq, const CallArgs& args, bool max, const std::string& fn) {
  Params p(fn, args, {"case_sensitive", "attribute"});
  const bool cs = p.BoolOr(0, false);
  const Value* attr = p.Get(1);
  std::vector<Value> items = Iterate(seq);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& v) {
    Value k = attr != nullptr && !attr->is_none() ? GetPath(v, *attr) : v;
    return cs ? k : LowerIfString(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (max ? Less(best_key, k) : Less(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

using FilterFn = std::function<Value(Interpreter&, const Value&, const CallArgs&)>;

const std::map<std::string, FilterFn, std::less<>>& Filters() {
  static const auto* filters = new std::map<std::string, FilterFn, std::less<>>{
      {"abs",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("abs", a, {});
         if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.as_double()));
         if (v.is_integer_like()) return v.as_int() < 0 ? Negate(v) : Value::Int(v.as_int());
         RequireDefined(v);
         ThrowError("bad operand type for abs(): '" + TypeName(v) + "'");
       }},
      {"attr",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("attr", a, {"name"});
         RequireDefined(v);
         return MethodOrUndefined(v, StrArg("attr", p.Required(0)));
       }},
      {"capitalize",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("capitalize", a, {});
         return Value::Str(PyCapitalize(ToStr(v)));
       }},
      {"count",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("count", a, {});
         return Value::Int(static_cast<int64_t>(Length(v)));
       }},
      {"default",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("default", a, {"default_value", "boolean"});
         if (v.is_undefined() || (p.BoolOr(1, false) && !Truthy(v))) {
           return p.Or(0, Value::Str(""));
         }
         return v;
       }},
      {"dictsort",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         Params p("dictsort", a, {"case_sensitive", "by", "reverse"});
         if (v.kind() != Value::Kind::kObject) ThrowError("dictsort: value is not a dict");
         const Value by = p.Or(1, Value::Str("key"));
         if (!by.is_string() || (by.as_string() != "key" && by.as_string() != "value")) {
           ThrowError("You can only sort by either \"key\" or \"value\"");
         }
         std::vector<Value> items;
         for (const auto& [k, x] : v.as_object().items) {
           items.push_back(Value::List({Value::Str(k), x}, true));
         }
         interp.Step(static_cast<int64_t>(items.size()));
         const Value index = Value::Int(by.as_string() == "key" ? 0 : 1);
         return Value::List(SortedItems(std::move(items), p.BoolOr(2, false), p.BoolOr(0, false),
                                        &index));
       }},
      {"escape",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("escape", a, {});
         return v.is_markup() ? v : Value::Markup(HtmlEscape(ToStr(v)));
       }},
      {"first",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("first", a, {});
         std::vector<Value> items = Iterate(v);
         if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
         return items[0];
       }},
      {"float",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("float", a, {"default"});
         RequireDefined(v);  // float(Undefined) raises
         if (v.is_number()) return Value::Float(v.as_double());
         double d = 0;
         if (v.is_string() && ParseFloat(v.as_string(), d)) return Value::Float(d);
         return p.Or(0, Value::Float(0.0));
       }},
      {"indent",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("indent", a, {"width", "first", "blank"});
         const Value width = p.Or(0, Value::Int(4));
         std::string indention;
         if (width.is_string()) {
           indention = width.as_string();
         } else if (width.is_integer_like()) {
           const int64_t w = width.as_int();
           if (w > static_cast<int64_t>(kMaxStringBytes)) CheckStringSize(kMaxStringBytes + 1);
           indention.assign(w > 0 ? static_cast<size_t>(w) : 0, ' ');
         } else {
           ThrowError("indent: width must be an integer or a string");
         }
         // Jinja2 appends "\n" to the value, which only a string allows.
         RequireDefined(v);
         if (!v.is_string()) {
           ThrowError("unsupported operand type(s) for +=: '" + TypeName(v) + "' and 'str'");
         }
         return Value::Str(
             IndentText(v.as_string(), indention, p.BoolOr(1, false), p.BoolOr(2, false)));
       }},
      {"int",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("int", a, {"default", "base"});
         const int64_t base = p.IntOr(1, 10);
         RequireDefined(v);  // int(Undefined) raises
         if (v.is_integer_like()) return Value::Int(v.as_int());
         if (v.kind() == Value::Kind::kFloat) {
           const double d = std::trunc(v.as_double());
           if (std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::Int(static_cast<int64_t>(d));
           return p.Or(0, Value::Int(0));
         }
         if (v.is_string()) {
           int64_t i = 0;
           if (ParseInt(v.as_string(), base, i)) return Value::Int(i);
           double d = 0;
           if (ParseFloat(v.as_string(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
             return Value::Int(static_cast<int64_t>(std::trunc(d)));
           }
         }
         return p.Or(0, Value::Int(0));
       }},
      {"items",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         Params p("items", a, {});
         if (v.is_undefined()) return Value::Generator({});
         if (v.kind() != Value::Kind::kObject) ThrowError("Can only get item pairs from a mapping.");
         std::vector<Value> items;
         interp.Step(static_cast<int64_t>(v.as_object().items.size()));
         for (const auto& [k, x] : v.as_object().items) {
           items.push_back(Value::List({Value::Str(k), x}, true));
         }
         return Value::Generator(std::move(items));
       }},
      {"join",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         Params p("join", a, {"d", "attribute"});
         const std::string sep = ToStr(p.Or(0, Value::Str("")));
         const Value* attr = p.Get(1);
         std::string out;
         size_t i = 0;
         for (const Value& x : Iterate(v)) {
           if (i++ > 0) out += sep;
           out += ToStr(attr != nullptr && !attr->is_none() ? GetPath(x, *attr) : x);
           CheckStringSize(out.size());
         }
         interp.Step(static_cast<int64_t>(i));
         return Value::Str(std::move(out));
       }},
      {"last",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("last", a, {});
         if (v.is_undefined() || v.is_generator()) {
           ThrowError("last: '" + TypeName(v) + "' object is not reversible");
         }
         std::vector<Value> items = Iterate(v);
         if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
         return items.back();
       }},
      {"length",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("length", a, {});
         return Value::Int(static_cast<int64_t>(Length(v)));
       }},
      {"list",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("list", a, {});
         return Value::List(Iterate(v));
       }},
      {"lower",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("lower", a, {});
         return Value::Str(PyLower(ToStr(v)));
       }},
      {"map", [](Interpreter& interp, const Value& v, const CallArgs& a) {
         return MapFilter(interp, v, a);
       }},
      {"max", [](Interpreter&, const Value& v, const CallArgs& a) {
         return MinMax(v, a, true, "max");
       }},
      {"min", [](Interpreter&, const Value& v, const CallArgs& a) {
         return MinMax(v, a, false, "min");
       }},
      {"reject", [](Interpreter& interp, const Value& v, const CallArgs& a) {
         return SelectOrReject(interp, v, a, false, false, "reject");
       }},
      {"rejectattr", [](Interpreter& interp, const Value& v, const CallArgs& a) {
         return SelectOrReject(interp, v, a, false, true, "rejectattr");
       }},
      {"replace",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         Params p("replace", a, {"old", "new", "count"});
         CallArgs m;
         m.positional = {Value::Str(ToStr(p.Required(0))), Value::Str(ToStr(p.Required(1))),
                         p.Or(2, Value::None())};
         return StrMethod(interp, ToStr(v), "replace", m);
       }},
      {"reverse",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("reverse", a, {});
         if (v.is_string()) {
           std::vector<char32_t> cps = DecodeUtf8(v.as_string());
           std::reverse(cps.begin(), cps.end());
           return Value::Str(EncodeUtf8(cps, 0, cps.size()));
         }
         std::vector<Value> items = Iterate(v);
         std::reverse(items.begin(), items.end());
         // reversed() of a list, tuple or dict is an iterator; anything else becomes a list.
         const bool reversible = (v.kind() == Value::Kind::kArray && !v.is_generator()) ||
                                 v.kind() == Value::Kind::kObject;
         return reversible ? Value::Generator(std::move(items)) : Value::List(std::move(items));
       }},
      {"safe",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("safe", a, {});
         return Value::Markup(ToStr(v));
       }},
      {"select", [](Interpreter& interp, const Value& v, const CallArgs& a) {
         return SelectOrReject(interp, v, a, true, false, "select");
       }},
      {"selectattr", [](Interpreter& interp, const Value& v, const CallArgs& a) {
         return SelectOrReject(interp, v, a, true, true, "selectattr");
       }},
      {"sort",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         Params p("sort", a, {"reverse", "case_sensitive", "attribute"});
         std::vector<Value> items = Iterate(v);
         interp.Step(static_cast<int64_t>(items.size()));
         return Value::List(
             SortedItems(std::move(items), p.BoolOr(0, false), p.BoolOr(1, false), p.Get(2)));
       }},
      {"string",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("string", a, {});
         return v.is_string() ? v : Value::Str(ToStr(v));
       }},
      {"sum",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         Params p("sum", a, {"attribute", "start"});
         Value total = p.Or(1, Value::Int(0));
         const Value* attr = p.Get(0);
         for (const Value& x : Iterate(v)) {
           total = BinaryOp(interp, "+", total,
                            attr != nullptr && !attr->is_none() ? GetPath(x, *attr) : x);
         }
         return total;
       }},
      {"title",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("title", a, {});
         // Jinja2 splits at runs of whitespace, -, (, {, [ and <, then upper-cases each piece's
         // first character and lower-cases the rest.
         std::string out;
         std::string piece;
         auto flush = [&] {
           const std::vector<char32_t> cps = DecodeUtf8(piece);
           if (!cps.empty()) {
             out += PyUpper(EncodeUtf8(cps, 0, 1)) + PyLower(EncodeUtf8(cps, 1, cps.size()));
           }
           piece.clear();
         };
         for (char32_t c : DecodeUtf8(ToStr(v))) {
           const bool sep = IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
           if (sep) {
             flush();
             AppendUtf8(c, out);
           } else {
             AppendUtf8(c, piece);
           }
         }
         flush();
         return Value::Str(std::move(out));
       }},
      {"tojson",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         Params p("tojson", a, {"indent", "separators", "sort_keys"});
         const Value indent = p.Or(0, Value::None());
         if (p.Get(1) != nullptr && !p.Get(1)->is_none()) {
           ThrowError("tojson: separators are not supported");
         }
         if (p.BoolOr(2, false)) ThrowError("tojson: sort_keys is not supported");
         std::optional<std::string> ind;
         if (indent.is_string()) {
           ind = indent.as_string();
         } else if (indent.is_integer_like()) {
           const int64_t n = indent.as_int();
           if (n > 4096) ThrowLimit("tojson: indent wider than 4096");
           ind = std::string(n > 0 ? static_cast<size_t>(n) : 0, ' ');
         } else if (!indent.is_none()) {
           ThrowError("tojson: indent must be an integer or a string");
         }
         std::string out = ToJson(v, ind);
         interp.Step(static_cast<int64_t>(out.size() / 64));
         return Value::Str(std::move(out));
       }},
      {"trim",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("trim", a, {"chars"});
         const Value chars = p.Or(0, Value::None());
         const std::string* set = chars.is_none() ? nullptr : &StrArg("trim", chars);
         return Value::Str(PyStrip(ToStr(v), set, true, true));
       }},
      {"unique",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         Params p("unique", a, {"case_sensitive", "attribute"});
         const bool cs = p.BoolOr(0, false);
         const Value* attr = p.Get(1);
         std::vector<Value> seen;
         std::vector<Value> out;
         for (const Value& x : Iterate(v)) {
           Value k = attr != nullptr && !attr->is_none() ? GetPath(x, *attr) : x;
           if (!cs) k = LowerIfString(k);
           if (k.kind() == Value::Kind::kObject ||
               (k.kind() == Value::Kind::kArray && !k.as_array().is_tuple)) {
             ThrowError("unhashable type: '" + TypeName(k) + "'");
           }
           interp.Step(static_cast<int64_t>(seen.size()));
           bool dup = false;
           for (const Value& s : seen) dup |= Equal(s, k);
           if (!dup) {
             seen.push_back(std::move(k));
             out.push_back(x);
           }
         }
         return Value::Generator(std::move(out));
       }},
      {"upper",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("upper", a, {});
         return Value::Str(PyUpper(ToStr(v)));
       }},
      {"wordcount",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         Params p("wordcount", a, {});
         return Value::Int(static_cast<int64_t>(PySplit(ToStr(v), nullptr, -1).size()));
       }},
  };
  return *filters;
}

const FilterFn* FindFilter(std::string_view name) {
  static const std::map<std::string, std::string, std::less<>> kAliases = {{"d", "default"},
                                                                           {"e", "escape"}};
  const auto alias = kAliases.find(name);
  if (alias != kAliases.end()) name = alias->second;
  const auto it = Filters().find(name);
  return it == Filters().end() ? nullptr : &it->second;
}

// ---- tests ----

using TestFn = std::function<bool(Interpreter&, const Value&, const CallArgs&)>;

bool IsIterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.kind() == Value::Kind::kArray ||
         v.kind() == Value::Kind::kObject;
}

const Value& OneArg(const std::string& test, const CallArgs& a) {
  if (a.positional.size() != 1 || !a.keyword.empty()) {
    ThrowError("test '" + test + "' takes exactly one argument");
  }
  return a.positional[0];
}

void NoArgs(const std::string& test, const CallArgs& a) {
  if (!a.positional.empty() || !a.keyword.empty()) {
    ThrowError("test '" + test + "' takes no arguments");
  }
}

const std::map<std::string, TestFn, std::less<>>& Tests() {
  auto simple = [](std::string name, std::function<bool(const Value&)> f) {
    return std::make_pair(name, TestFn([name, f](Interpreter&, const Value& v, const CallArgs& a) {
                            NoArgs(name, a);
                            return f(v);
                          }));
  };
  auto compare = [](std::string name, std::string op) {
    return std::make_pair(name, TestFn([name, op](Interpreter&, const Value& v, const CallArgs& a) {
                            return CompareOp(op, v, OneArg(name, a));
                          }));
  };
  static const auto* tests = new std::map<std::string, TestFn, std::less<>>{
      simple("boolean", [](const Value& v) { return v.kind() == Value::Kind::kBool; }),
      simple("callable", [](const Value& v) { return v.kind() == Value::Kind::kCallable; }),
      simple("defined", [](const Value& v) { return !v.is_undefined(); }),
      simple("undefined", [](const Value& v) { return v.is_undefined(); }),
      simple("none", [](const Value& v) { return v.is_none(); }),
      simple("true", [](const Value& v) { return v.kind() == Value::Kind::kBool && v.as_bool(); }),
      simple("false",
             [](const Value& v) { return v.kind() == Value::Kind::kBool && !v.as_bool(); }),
      simple("integer", [](const Value& v) { return v.kind() == Value::Kind::kInt; }),
      simple("float", [](const Value& v) { return v.kind() == Value::Kind::kFloat; }),
      simple("number", [](const Value& v) { return v.is_number(); }),
      simple("string", [](const Value& v) { return v.is_string(); }),
      simple("mapping", [](const Value& v) { return v.kind() == Value::Kind::kObject; }),
      simple("iterable", IsIterable),
      simple("sequence",
             [](const Value& v) {
               return v.is_undefined() || v.is_string() || v.kind() == Value::Kind::kObject ||
                      (v.kind() == Value::Kind::kArray && !v.is_generator());
             }),
      simple("escaped", [](const Value& v) { return v.is_markup(); }),
      simple("lower", [](const Value& v) { return PyIsLower(ToStr(v)); }),
      simple("upper", [](const Value& v) { return PyIsUpper(ToStr(v)); }),
      simple("odd",
             [](const Value& v) {
               if (!v.is_integer_like()) ThrowError("odd: value is not an integer");
               return v.as_int() % 2 != 0;
             }),
      simple("even",
             [](const Value& v) {
               if (!v.is_integer_like()) ThrowError("even: value is not an integer");
               return v.as_int() % 2 == 0;
             }),
      {"divisibleby",
       [](Interpreter& interp, const Value& v, const CallArgs& a) {
         const Value& n = OneArg("divisibleby", a);
         return Equal(BinaryOp(interp, "%", v, n), Value::Int(0));
       }},
      {"sameas",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         const Value& o = OneArg("sameas", a);
         // Python's `is`: singletons compare by value, containers by identity.
         if (v.kind() != o.kind()) return false;
         switch (v.kind()) {
           case Value::Kind::kNone:
           case Value::Kind::kUndefined:
             return v.kind() == Value::Kind::kNone;
           case Value::Kind::kBool:
             return v.as_bool() == o.as_bool();
           case Value::Kind::kArray:
             return &v.as_array() == &o.as_array();
           case Value::Kind::kObject:
             return &v.as_object() == &o.as_object();
           case Value::Kind::kNamespace:
             return v.namespace_ptr() == o.namespace_ptr();
           default:
             return Equal(v, o);
         }
       }},
      {"in", [](Interpreter&, const Value& v,
                const CallArgs& a) { return Contains(OneArg("in", a), v); }},
      {"filter",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         NoArgs("filter", a);
         return v.is_string() && IsKnownFilter(v.as_string());
       }},
      {"test",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         NoArgs("test", a);
         return v.is_string() && IsKnownTest(v.as_string());
       }},
      compare("eq", "=="),
      compare("equalto", "=="),
      compare("==", "=="),
      compare("ne", "!="),
      compare("!=", "!="),
      compare("lt", "<"),
      compare("lessthan", "<"),
      compare("<", "<"),
      compare("le", "<="),
      compare("<=", "<="),
      compare("gt", ">"),
      compare("greaterthan", ">"),
      compare(">", ">"),
      compare("ge", ">="),
      compare(">=", ">="),
  };
  return *tests;
}

// ---- global functions ----

class BuiltinFn : public Callable {
 public:
  using Fn = std::function<Value(Interpreter&, const CallArgs&)>;
  BuiltinFn(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  Value Call(Interpreter& interp, const CallArgs& args) const override { return fn_(interp, args); }

 private:
  std::string name_;
  Fn fn_;
};

// The sandbox's range() refuses more than this many items.
constexpr int64_t kMaxRange = 100000;

Value Range(Interpreter& interp, const CallArgs& a) {
  if (!a.keyword.empty()) ThrowError("range() takes no keyword arguments");
  std::vector<int64_t> n;
  for (const Value& v : a.positional) {
    if (!v.is_integer_like()) {
      RequireDefined(v);
      ThrowError(absl::StrCat("\'", TypeName(v), "' object cannot be interpreted as an integer"));
    }
    n.push_back(v.as_int());
  }
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (n.size() == 1) {
    stop = n[0];
  } else if (n.size() == 2 || n.size() == 3) {
    start = n[0];
    stop = n[1];
    if (n.size() == 3) step = n[2];
  } else {
    ThrowError("range expected 1 to 3 arguments, got " + std::to_string(n.size()));
  }
  if (step == 0) ThrowError("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (static_cast<int64_t>(items.size()) >= kMaxRange) {
      ThrowLimit("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    items.push_back(Value::Int(i));
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  interp.Step(static_cast<int64_t>(items.size()));
  return Value::List(std::move(items));
}

}  // namespace

bool IsKnownFilter(std::string_view name) { return FindFilter(name) != nullptr; }
bool IsKnownTest(std::string_view name) { return Tests().count(name) > 0; }

Value ApplyFilter(Interpreter& interp, const std::string& name, const Value& subject,
                  const CallArgs& args) {
  const FilterFn* f = FindFilter(name);
  if (f == nullptr) ThrowError("no filter named '" + name + "'");
  // These are Python generators: their errors surface only when the result is iterated.
  const bool lazy = name == "select" || name == "reject" || name == "selectattr" ||
                    name == "rejectattr" || name == "map" || name == "items" || name == "unique";
  if (!lazy) return (*f)(interp, subject, args);
  try {
    return (*f)(interp, subject, args);
  } catch (const TemplateError& e) {
    if (e.code() != absl::StatusCode::kInvalidArgument) throw;  // limits stay immediate
    return Value::FailedGenerator(e.message());
  }
}

bool ApplyTest(Interpreter& interp, const std::string& name, const Value& subject,
               const CallArgs& args) {
  const auto it = Tests().find(name);
  if (it == Tests().end()) ThrowError("no test named '" + name + "'");
  return it->second(interp, subject, args);
}

Value GetAttribute(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      RequireDefined(obj);
      break;
    case Value::Kind::kObject: {
      if (IsDictMethod(name) || IsUnsafeMethod(obj, name)) return MethodOrUndefined(obj, name);
      const Value* v = obj.as_object().Find(name);
      if (v != nullptr) return *v;
      return Value::Undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Kind::kNamespace: {
      const Value* v = obj.as_namespace().Find(name);
      if (v != nullptr) return *v;
      return Value::Undefined("'Namespace object' has no attribute '" + name + "'");
    }
    default:
      break;
  }
  return MethodOrUndefined(obj, name);
}

Value GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      RequireDefined(obj);
      break;
    case Value::Kind::kObject:
      if (key.is_string()) {
        const Value* v = obj.as_object().Find(key.as_string());
        if (v != nullptr) return *v;
      }
      break;
    case Value::Kind::kArray:
      if (key.is_integer_like() && !obj.is_generator() && obj.as_array().dict_view == nullptr) {
        const auto& items = obj.as_array().items;
        const int64_t i = PyIndex(key.as_int(), items.size());
        if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
        return Value::Undefined(ObjectDesc(obj) + " has no element " +
                                std::to_string(key.as_int()));
      }
      break;
    case Value::Kind::kString:
      if (key.is_integer_like()) {
        const std::vector<char32_t> cps = DecodeUtf8(obj.as_string());
        const int64_t i = PyIndex(key.as_int(), cps.size());
        if (i >= 0 && i < static_cast<int64_t>(cps.size())) {
          return Value::Str(EncodeUtf8(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
        }
        return Value::Undefined("'str object' has no element " + std::to_string(key.as_int()));
      }
      break;
    case Value::Kind::kNamespace:
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (obj.kind() == Value::Kind::kObject) {
      Value m = MethodOrUndefined(obj, key.as_string());
      if (m.kind() == Value::Kind::kCallable) return m;
      return Value::Undefined("'dict object' has no attribute '" + key.as_string() + "'");
    }
    return GetAttribute(obj, key.as_string());
  }
  return Value::Undefined(ObjectDesc(obj) + " has no element " + Repr(key));
}

Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  RequireDefined(obj);
  auto part = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!v.is_integer_like()) {
      RequireDefined(v);
      ThrowError(std::string("slice ") + what + " must be an integer or None");
    }
    return v.as_int();
  };
  const std::optional<int64_t> a = part(start, "start");
  const std::optional<int64_t> b = part(stop, "stop");
  const int64_t c = part(step, "step").value_or(1);
  if (c == 0) ThrowError("slice step cannot be zero");
  std::vector<char32_t> cps;
  size_t n = 0;
  if (obj.is_string()) {
    cps = DecodeUtf8(obj.as_string());
    n = cps.size();
  } else if (obj.kind() == Value::Kind::kArray && !obj.is_generator() &&
             obj.as_array().dict_view == nullptr) {
    n = obj.as_array().items.size();
  } else {
    // Jinja2 slices with Python's own subscript (not its forgiving getitem).
    ThrowError(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  const auto len = static_cast<int64_t>(n);
  auto clamp = [&](std::optional<int64_t> x, int64_t def) {
    if (!x) return def;
    int64_t i = *x;
    if (i < 0) i += len;
    if (c > 0) return std::clamp<int64_t>(i, 0, len);
    return std::clamp<int64_t>(i, -1, len - 1);
  };
  const int64_t lo = clamp(a, c > 0 ? 0 : len - 1);
  const int64_t hi = clamp(b, c > 0 ? len : -1);
  std::vector<size_t> idx;
  for (int64_t i = lo; c > 0 ? i < hi : i > hi;) {
    idx.push_back(static_cast<size_t>(i));
    if (__builtin_add_overflow(i, c, &i)) break;
  }
  if (obj.is_string()) {
    std::string out;
    for (size_t i : idx) AppendUtf8(cps[i], out);
    return Value::Str(std::move(out));
  }
  std::vector<Value> items;
  for (size_t i : idx) items.push_back(obj.as_array().items[i]);
  return Value::List(std::move(items), obj.as_array().is_tuple);
}

std::vector<Value> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kArray:
      if (!v.as_array().deferred_error.empty()) ThrowError(v.as_array().deferred_error);
      return v.as_array().items;
    case Value::Kind::kString: {
      std::vector<Value> out;
      for (char32_t c : DecodeUtf8(v.as_string())) {
        std::string s;
        AppendUtf8(c, s);
        out.push_back(Value::Str(std::move(s)));
      }
      return out;
    }
    case Value::Kind::kObject: {
      std::vector<Value> out;
      for (const auto& kv : v.as_object().items) out.push_back(Value::Str(kv.first));
      return out;
    }
    default:
      ThrowError(absl::StrCat("\'", TypeName(v), "' object is not iterable"));
  }
}

std::vector<std::pair<std::string, Value>> GlobalFunctions() {
  std::vector<std::pair<std::string, Value>> g;
  auto add = [&](const std::string& name, BuiltinFn::Fn fn) {
    g.emplace_back(name, Value::Func(std::make_shared<BuiltinFn>(name, std::move(fn))));
  };
  add("range", Range);
  add("namespace", [](Interpreter& interp, const CallArgs& a) {
    auto ns = std::make_shared<Namespace>();
    if (a.positional.size() > 1) ThrowError("namespace() takes at most one positional argument");
    if (a.positional.size() == 1) {
      if (a.positional[0].kind() != Value::Kind::kObject) {
        ThrowError("namespace(): the positional argument must be a dict");
      }
      for (const auto& [k, v] : a.positional[0].as_object().items) ns->Set(k, v);
    }
    for (const auto& [k, v] : a.keyword) ns->Set(k, v);
    interp.Track(ns);
    return Value::Ns(ns);
  });
  add("dict", [](Interpreter&, const CallArgs& a) {
    if (!a.positional.empty()) ThrowError("dict() with positional arguments is not supported");
    std::vector<std::pair<std::string, Value>> items;
    for (const auto& [k, v] : a.keyword) items.emplace_back(k, v);
    return Value::Dict(std::move(items));
  });
  add("raise_exception", [](Interpreter&, const CallArgs& a) -> Value {
    Params p("raise_exception", a, {"message"});
    throw TemplateError(absl::StatusCode::kFailedPrecondition,
                        "raise_exception: " + ToStr(p.Or(0, Value::Str(""))));
  });
  add("strftime_now", [](Interpreter& interp, const CallArgs& a) {
    Params p("strftime_now", a, {"format"});
    const std::string& fmt = StrArg("strftime_now", p.Required(0));
    if (fmt.size() > 256) ThrowError("strftime_now: format longer than 256 bytes");
    const std::time_t t = static_cast<std::time_t>(interp.now_unix_seconds());
    std::tm tm{};
    localtime_r(&t, &tm);
    std::string buf(4096, '\0');
    const size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty()) ThrowError("strftime_now: the formatted date is empty or too long");
    buf.resize(n);
    return Value::Str(std::move(buf));
  });
  return g;
}

}  // namespace thermocline::chat
