// Values of the chat-template interpreter, with Python's semantics as Jinja2 exposes them:
// truthiness, str() and repr(), ==, ordering, and the "undefined" value a missing name or key
// yields. Lists, tuples and dicts are immutable once built (the template environment is an
// ImmutableSandboxedEnvironment) and shared by pointer; a namespace() is the one mutable kind.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace thermocline::chat {

// Lists, dicts and tuples nest at most this deep (a template could otherwise build a chain deep
// enough to overflow the stack when it is printed, compared or freed).
inline constexpr int kMaxValueDepth = 256;
// No string the engine builds (concatenation, repetition, str() of a list, tojson ...) may be
// longer: a template could otherwise ask for gigabytes in one expression.
inline constexpr size_t kMaxStringBytes = size_t{16} << 20;
// Raises a limit error when a string of `bytes` bytes would exceed kMaxStringBytes.
void CheckStringSize(size_t bytes);

// Raised anywhere inside parsing or rendering and turned into an absl::Status at the API edge
// (chat_template.cc): an exception unwinds the interpreter's deep recursion in one step.
class TemplateError : public std::runtime_error {
 public:
  TemplateError(absl::StatusCode code, std::string message)
      : std::runtime_error(message), code_(code), message_(std::move(message)) {}
  absl::StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  bool has_position() const { return line_ > 0; }
  int line() const { return line_; }
  int column() const { return column_; }
  void set_position(int line, int column) {
    line_ = line;
    column_ = column;
  }

 private:
  absl::StatusCode code_;
  std::string message_;
  int line_ = 0;
  int column_ = 0;
};

[[noreturn]] void ThrowError(std::string message);  // InvalidArgument
[[noreturn]] void ThrowLimit(std::string message);  // ResourceExhausted

class Value;
class Callable;
class Interpreter;

struct Array {
  std::vector<Value> items;
  bool is_tuple = false;
  // What Jinja2's select/map/items/unique/reverse return: a Python iterator, which iterates like
  // a list but is always true, has no length, prints as an object and is not JSON.
  bool is_generator = false;
  // A generator whose computation failed: Python computes generators lazily, so the error is
  // raised only when the items are used (iterated, searched), never by printing or testing it.
  std::string deferred_error;
  // dict.keys() / values() / items(): "dict_keys" ... (printed so, not indexable, not JSON).
  const char* dict_view = nullptr;
  int depth = 1;
};

struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, keys unique
  int depth = 1;
  const Value* Find(std::string_view key) const;
};

// namespace(...): attributes assignable with {% set ns.attr = ... %}.
struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kNamespace,
    kCallable
  };

  // Undefined; `hint` is the error raised when the value is used in a way that needs a value
  // (Jinja2's "'x' is undefined").
  Value() : v_(Undef{}) {}
  static Value Undefined(std::string hint) { return Value(Undef{std::move(hint)}); }
  static Value None() { return Value(std::monostate{}); }
  static Value Bool(bool b) { return Value(b); }
  static Value Int(int64_t i) { return Value(i); }
  static Value Float(double d) { return Value(d); }
  static Value Str(std::string s);
  // A string marked safe (Jinja2's Markup, from |safe or |escape): `+` with a plain string
  // HTML-escapes the plain one, as Python's Markup.__add__ does.
  static Value Markup(std::string s);
  bool is_markup() const { return markup_; }
  // Fail with a limit error when the result would nest deeper than kMaxValueDepth.
  static Value List(std::vector<Value> items, bool is_tuple = false) {
    return MakeArray(std::move(items), is_tuple, false);
  }
  static Value Generator(std::vector<Value> items) {
    return MakeArray(std::move(items), false, true);
  }
  static Value FailedGenerator(std::string error);
  static Value DictView(const char* view, std::vector<Value> items);
  bool is_generator() const { return kind() == Kind::kArray && as_array().is_generator; }
  static Value Dict(std::vector<std::pair<std::string, Value>> items);
  static Value Ns(std::shared_ptr<Namespace> ns) { return Value(std::move(ns)); }
  static Value Func(std::shared_ptr<const Callable> f) { return Value(std::move(f)); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  // int or bool (Python's bool is an int).
  bool is_integer_like() const { return kind() == Kind::kInt || kind() == Kind::kBool; }
  bool is_number() const { return is_integer_like() || kind() == Kind::kFloat; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;    // int or bool
  double as_double() const;  // any number
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  const Array& as_array() const { return *std::get<std::shared_ptr<const Array>>(v_); }
  const Object& as_object() const { return *std::get<std::shared_ptr<const Object>>(v_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const std::shared_ptr<Namespace>& namespace_ptr() const {
    return std::get<std::shared_ptr<Namespace>>(v_);
  }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undef>(v_).hint; }
  // Nesting depth: 0 for scalars.
  int depth() const;

 private:
  struct Undef {
    std::string hint;
  };
  // Strings are shared: templates copy values freely (loop items, list concatenation).
  using Storage =
      std::variant<Undef, std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
                   std::shared_ptr<const Array>, std::shared_ptr<const Object>,
                   std::shared_ptr<Namespace>, std::shared_ptr<const Callable>>;
  template <typename T>
  explicit Value(T x) : v_(std::move(x)) {}
  static Value MakeArray(std::vector<Value> items, bool is_tuple, bool is_generator);
  Storage v_;
  bool markup_ = false;
};

// Positional and keyword arguments of a call, in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A macro, a global function (range, namespace, raise_exception ...) or a bound method.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual std::string name() const = 0;
  virtual Value Call(Interpreter& interp, const CallArgs& args) const = 0;
};

// Raises "'x' is undefined" (the value's hint) when `v` is undefined.
void RequireDefined(const Value& v);

// Python semantics.
bool Truthy(const Value& v);
std::string ToStr(const Value& v);  // str(v); undefined is ""
std::string Repr(const Value& v);   // repr(v)
bool Equal(const Value& a, const Value& b);
// a < b, raising TypeError as Python does for unorderable operands.
bool Less(const Value& a, const Value& b);
// Python's type(v).__name__.
std::string TypeName(const Value& v);

}  // namespace thermocline::chat
