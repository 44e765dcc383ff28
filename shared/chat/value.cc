#include "shared/chat/value.h"

#include <algorithm>
#include <cmath>

#include "shared/chat/text.h"

namespace thermocline::chat {

void ThrowError(std::string message) {
  throw TemplateError(absl::StatusCode::kInvalidArgument, std::move(message));
}

void ThrowLimit(std::string message) {
  throw TemplateError(absl::StatusCode::kResourceExhausted, std::move(message));
}

void CheckStringSize(size_t bytes) {
  if (bytes > kMaxStringBytes) {
    ThrowLimit("a string would be longer than " + std::to_string(kMaxStringBytes) + " bytes");
  }
}

Value Value::Str(std::string s) {
  CheckStringSize(s.size());
  return Value(std::shared_ptr<const std::string>(std::make_shared<std::string>(std::move(s))));
}

Value Value::Markup(std::string s) {
  Value v = Str(std::move(s));
  v.markup_ = true;
  return v;
}

const Value* Object::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value* Namespace::Find(std::string_view key) const {
  for (const auto& [k, v] : attrs) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Namespace::Set(const std::string& key, Value v) {
  for (auto& [k, old] : attrs) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  attrs.emplace_back(key, std::move(v));
}

int Value::depth() const {
  switch (kind()) {
    case Kind::kArray:
      return as_array().depth;
    case Kind::kObject:
      return as_object().depth;
    default:
      return 0;
  }
}

Value Value::MakeArray(std::vector<Value> items, bool is_tuple, bool is_generator) {
  int d = 0;
  for (const Value& v : items) d = std::max(d, v.depth());
  if (d + 1 > kMaxValueDepth) {
    ThrowLimit("lists and dicts nest deeper than " + std::to_string(kMaxValueDepth));
  }
  auto a = std::make_shared<Array>();
  a->items = std::move(items);
  a->is_tuple = is_tuple;
  a->is_generator = is_generator;
  a->depth = d + 1;
  return Value(std::shared_ptr<const Array>(std::move(a)));
}

Value Value::Dict(std::vector<std::pair<std::string, Value>> items) {
  int d = 0;
  for (const auto& kv : items) d = std::max(d, kv.second.depth());
  if (d + 1 > kMaxValueDepth) {
    ThrowLimit("lists and dicts nest deeper than " + std::to_string(kMaxValueDepth));
  }
  auto o = std::make_shared<Object>();
  o->items = std::move(items);
  o->depth = d + 1;
  return Value(std::shared_ptr<const Object>(std::move(o)));
}

Value Value::FailedGenerator(std::string error) {
  auto a = std::make_shared<Array>();
  a->is_generator = true;
  a->deferred_error = std::move(error);
  return Value(std::shared_ptr<const Array>(std::move(a)));
}

Value Value::DictView(const char* view, std::vector<Value> items) {
  Value v = List(std::move(items));
  auto a = std::make_shared<Array>(v.as_array());
  a->dict_view = view;
  return Value(std::shared_ptr<const Array>(std::move(a)));
}

int64_t Value::as_int() const {
  if (kind() == Kind::kBool) return as_bool() ? 1 : 0;
  return std::get<int64_t>(v_);
}

double Value::as_double() const {
  if (kind() == Kind::kFloat) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

void RequireDefined(const Value& v) {
  if (v.is_undefined()) {
    ThrowError(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
  }
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_double() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kArray:
      return v.as_array().is_generator || !v.as_array().items.empty();
    case Value::Kind::kObject:
      return !v.as_object().items.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

std::string ToStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return v.as_string();
    default:
      return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return PyFloatRepr(v.as_double());
    case Value::Kind::kString:
      return PyStrRepr(v.as_string());
    case Value::Kind::kArray: {
      const Array& a = v.as_array();
      if (a.is_generator) return "<generator object>";
      std::string out = a.dict_view != nullptr ? std::string(a.dict_view) + "(["
                        : a.is_tuple           ? "("
                                               : "[";
      for (size_t i = 0; i < a.items.size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr(a.items[i]);
        CheckStringSize(out.size());
      }
      if (a.is_tuple && a.items.size() == 1) out += ",";
      out += a.dict_view != nullptr ? "])" : a.is_tuple ? ")" : "]";
      return out;
    }
    case Value::Kind::kObject: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.as_object().items) {
        if (!first) out += ", ";
        first = false;
        out += PyStrRepr(k) + ": " + Repr(x);
        CheckStringSize(out.size());
      }
      return out + "}";
    }
    // Python prints an address here; no template can depend on it. Contents are not printed
    // (a namespace may contain itself).
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kCallable:
      return "<function " + v.as_callable().name() + ">";
  }
  return "";
}

bool Equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kArray: {
      const Array& x = a.as_array();
      const Array& y = b.as_array();
      if (x.is_generator || y.is_generator) return &x == &y;
      if ((x.dict_view == nullptr) != (y.dict_view == nullptr)) return false;
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!Equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case K::kObject: {
      const Object& x = a.as_object();
      const Object& y = b.as_object();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.Find(k);
        if (w == nullptr || !Equal(v, *w)) return false;
      }
      return true;
    }
    case K::kNamespace:
      return a.namespace_ptr() == b.namespace_ptr();
    case K::kCallable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

bool Less(const Value& a, const Value& b) {
  using K = Value::Kind;
  RequireDefined(a);
  RequireDefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.kind() == K::kString && b.kind() == K::kString) return a.as_string() < b.as_string();
  if (a.kind() == K::kArray && b.kind() == K::kArray && !a.is_generator() && !b.is_generator() &&
      a.as_array().is_tuple == b.as_array().is_tuple) {
    const auto& x = a.as_array().items;
    const auto& y = b.as_array().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equal(x[i], y[i])) return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  ThrowError("'<' not supported between instances of '" + TypeName(a) + "' and '" + TypeName(b) +
             "'");
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kArray:
      if (v.as_array().dict_view != nullptr) return v.as_array().dict_view;
      return v.as_array().is_generator ? "generator" : v.as_array().is_tuple ? "tuple" : "list";
    case Value::Kind::kObject:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

}  // namespace thermocline::chat
