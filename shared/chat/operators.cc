#include "shared/chat/operators.h"

#include <cmath>
#include <limits>

#include "shared/chat/builtins.h"
#include "shared/chat/interpreter.h"
#include "shared/chat/text.h"

namespace thermocline::chat {

namespace {

[[noreturn]] void Unsupported(std::string_view op, const Value& a, const Value& b) {
  ThrowError("unsupported operand type(s) for " + std::string(op) + ": '" + TypeName(a) +
             "' and '" + TypeName(b) + "'");
}

[[noreturn]] void Overflow() {
  ThrowError("integer overflow (integers are 64-bit here; Python's are unbounded)");
}

bool IsFloatOp(const Value& a, const Value& b) {
  return a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat;
}

Value Repeat(Interpreter& interp, const Value& seq, int64_t n) {
  if (seq.is_string()) {
    const size_t len = seq.as_string().size();
    if (n <= 0 || len == 0) return Value::Str("");
    if (len > 0 && static_cast<uint64_t>(n) > kMaxStringBytes / len)
      CheckStringSize(kMaxStringBytes + 1);
    std::string out;
    out.reserve(len * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    interp.Step(static_cast<int64_t>(out.size() / 64));
    return Value::Str(std::move(out));
  }
  const Array& a = seq.as_array();
  std::vector<Value> items;
  if (n > 0 && !a.items.empty()) {
    int64_t total = 0;
    if (__builtin_mul_overflow(n, static_cast<int64_t>(a.items.size()), &total)) {
      total = std::numeric_limits<int64_t>::max() / 2;
    }
    interp.Step(total);
    for (int64_t i = 0; i < n; ++i) items.insert(items.end(), a.items.begin(), a.items.end());
  }
  return Value::List(std::move(items), a.is_tuple);
}

int64_t FloorDiv(int64_t a, int64_t b) {
  if (a == std::numeric_limits<int64_t>::min() && b == -1) Overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t Mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

double FloatMod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

}  // namespace

Value BinaryOp(Interpreter& interp, std::string_view op, const Value& a, const Value& b) {
  RequireDefined(a);
  RequireDefined(b);
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (nums) {
      if (IsFloatOp(a, b)) return Value::Float(a.as_double() + b.as_double());
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) Overflow();
      return Value::Int(r);
    }
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {
        std::string x = a.is_markup() ? a.as_string() : HtmlEscape(a.as_string());
        std::string y = b.is_markup() ? b.as_string() : HtmlEscape(b.as_string());
        CheckStringSize(x.size() + y.size());
        return Value::Markup(x + y);
      }
      CheckStringSize(a.as_string().size() + b.as_string().size());
      interp.Step(static_cast<int64_t>((a.as_string().size() + b.as_string().size()) / 64));
      return Value::Str(a.as_string() + b.as_string());
    }
    if (a.kind() == Value::Kind::kArray && b.kind() == Value::Kind::kArray && !a.is_generator() &&
        !b.is_generator() && a.as_array().dict_view == nullptr &&
        b.as_array().dict_view == nullptr && a.as_array().is_tuple == b.as_array().is_tuple) {
      std::vector<Value> items = a.as_array().items;
      items.insert(items.end(), b.as_array().items.begin(), b.as_array().items.end());
      interp.Step(static_cast<int64_t>(items.size()));
      return Value::List(std::move(items), a.as_array().is_tuple);
    }
    if (a.is_string() || a.kind() == Value::Kind::kArray) {
      ThrowError("can only concatenate " + TypeName(a) + " (not \"" + TypeName(b) + "\") to " +
                 TypeName(a));
    }
    Unsupported(op, a, b);
  }
  if (op == "*") {
    if (nums) {
      if (IsFloatOp(a, b)) return Value::Float(a.as_double() * b.as_double());
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) Overflow();
      return Value::Int(r);
    }
    const auto is_seq = [](const Value& v) {
      return v.is_string() || (v.kind() == Value::Kind::kArray && !v.is_generator() &&
                               v.as_array().dict_view == nullptr);
    };
    if (is_seq(a) && b.is_integer_like()) return Repeat(interp, a, b.as_int());
    if (is_seq(b) && a.is_integer_like()) return Repeat(interp, b, a.as_int());
    Unsupported(op, a, b);
  }
  if (!nums) {
    if (op == "%" && a.is_string()) ThrowError("string formatting with '%' is not supported");
    Unsupported(op, a, b);
  }
  if (op == "-") {
    if (IsFloatOp(a, b)) return Value::Float(a.as_double() - b.as_double());
    int64_t r;
    if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) Overflow();
    return Value::Int(r);
  }
  if (op == "/") {
    if (b.as_double() == 0) ThrowError("division by zero");
    return Value::Float(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (IsFloatOp(a, b)) {
      if (b.as_double() == 0) ThrowError("float division by zero");
      if (op == "%") return Value::Float(FloatMod(a.as_double(), b.as_double()));
      return Value::Float(std::floor(a.as_double() / b.as_double()));
    }
    if (b.as_int() == 0) ThrowError("integer division or modulo by zero");
    return Value::Int(op == "//" ? FloorDiv(a.as_int(), b.as_int()) : Mod(a.as_int(), b.as_int()));
  }
  if (op == "**") {
    if (IsFloatOp(a, b) || b.as_int() < 0) {
      if (a.as_double() == 0 && b.as_double() < 0) {
        ThrowError("0.0 cannot be raised to a negative power");
      }
      const double r = std::pow(a.as_double(), b.as_double());
      if (std::isnan(r) && !std::isnan(a.as_double()) && !std::isnan(b.as_double())) {
        ThrowError("a negative number cannot be raised to a fractional power here");
      }
      return Value::Float(r);
    }
    int64_t base = a.as_int();
    int64_t e = b.as_int();
    int64_t r = 1;
    while (e > 0) {
      if (e & 1) {
        if (__builtin_mul_overflow(r, base, &r)) Overflow();
      }
      e >>= 1;
      if (e > 0 && __builtin_mul_overflow(base, base, &base)) Overflow();
    }
    return Value::Int(r);
  }
  ThrowError("unknown operator " + std::string(op));
}

Value Negate(const Value& v) {
  RequireDefined(v);
  if (v.kind() == Value::Kind::kFloat) return Value::Float(-v.as_double());
  if (v.is_integer_like()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) Overflow();
    return Value::Int(-v.as_int());
  }
  ThrowError("bad operand type for unary -: '" + TypeName(v) + "'");
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        RequireDefined(item);
        ThrowError("'in <string>' requires string as left operand, not " + TypeName(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kArray:
      if (!container.as_array().deferred_error.empty()) {
        ThrowError(container.as_array().deferred_error);
      }
      for (const Value& x : container.as_array().items) {
        if (Equal(x, item)) return true;
      }
      return false;
    case Value::Kind::kObject:
      if (item.is_string()) return container.as_object().Find(item.as_string()) != nullptr;
      if (item.kind() == Value::Kind::kObject ||
          (item.kind() == Value::Kind::kArray && !item.as_array().is_tuple) ||
          item.kind() == Value::Kind::kNamespace) {
        ThrowError("unhashable type: '" + TypeName(item) + "'");
      }
      return false;
    default:
      ThrowError("argument of type '" + TypeName(container) + "' is not iterable");
  }
}

bool CompareOp(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return Equal(a, b);
  if (op == "!=") return !Equal(a, b);
  if (op == "<") return Less(a, b);
  if (op == ">") return Less(b, a);
  if (op == "<=") return !Less(b, a);
  if (op == ">=") return !Less(a, b);
  if (op == "in") return Contains(b, a);
  if (op == "notin") return !Contains(b, a);
  ThrowError("unknown comparison " + std::string(op));
}

}  // namespace thermocline::chat
