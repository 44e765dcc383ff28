#include "shared/chat/json_value.h"

#include <cmath>
#include <limits>

#include "shared/chat/text.h"

namespace thermocline::chat {

namespace {

Value FromJsonAt(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) {
    ThrowError("JSON nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        ThrowError("JSON integer " + std::to_string(u) + " is beyond 64-bit range");
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(FromJsonAt(x, depth + 1));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      items.reserve(j.size());
      for (const auto& [k, x] : j.items()) items.emplace_back(k, FromJsonAt(x, depth + 1));
      return Value::Dict(std::move(items));
    }
    default:
      ThrowError("unsupported JSON value (binary)");
  }
}

class Dumper {
 public:
  explicit Dumper(std::optional<std::string> indent) : indent_(std::move(indent)) {}

  void Dump(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out_ += "null";
        break;
      case Value::Kind::kBool:
        out_ += v.as_bool() ? "true" : "false";
        break;
      case Value::Kind::kInt:
        out_ += std::to_string(v.as_int());
        break;
      case Value::Kind::kFloat: {
        const double d = v.as_double();
        if (std::isnan(d)) {
          out_ += "NaN";
        } else if (std::isinf(d)) {
          out_ += d < 0 ? "-Infinity" : "Infinity";
        } else {
          out_ += PyFloatRepr(d);
        }
        break;
      }
      case Value::Kind::kString:
        out_ += JsonQuote(v.as_string());
        break;
      case Value::Kind::kArray: {
        const Array& a = v.as_array();
        if (a.is_generator || a.dict_view != nullptr) Unserializable(v);
        if (a.items.empty()) {
          out_ += "[]";
          break;
        }
        out_ += "[";
        for (size_t i = 0; i < a.items.size(); ++i) {
          if (i > 0) out_ += indent_ ? "," : ", ";
          Newline(level + 1);
          Dump(a.items[i], level + 1);
        }
        Newline(level);
        out_ += "]";
        break;
      }
      case Value::Kind::kObject: {
        const Object& o = v.as_object();
        if (o.items.empty()) {
          out_ += "{}";
          break;
        }
        out_ += "{";
        bool first = true;
        for (const auto& [k, x] : o.items) {
          if (!first) out_ += indent_ ? "," : ", ";
          first = false;
          Newline(level + 1);
          out_ += JsonQuote(k);
          out_ += ": ";
          Dump(x, level + 1);
        }
        Newline(level);
        out_ += "}";
        break;
      }
      default:
        Unserializable(v);
    }
    CheckStringSize(out_.size());
  }

  std::string Take() { return std::move(out_); }

 private:
  [[noreturn]] static void Unserializable(const Value& v) {
    ThrowError("tojson: Object of type " + TypeName(v) + " is not JSON serializable");
  }

  void Newline(int level) {
    if (!indent_) return;
    out_ += "\n";
    for (int i = 0; i < level; ++i) {
      out_ += *indent_;
      CheckStringSize(out_.size());
    }
  }

  std::optional<std::string> indent_;
  std::string out_;
};

}  // namespace

Value FromJson(const nlohmann::ordered_json& j) { return FromJsonAt(j, 1); }

std::string ToJson(const Value& v, std::optional<std::string> indent) {
  Dumper d(std::move(indent));
  d.Dump(v, 0);
  return d.Take();
}

}  // namespace thermocline::chat
