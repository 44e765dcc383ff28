#include "shared/grammar/json_schema.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "shared/grammar/gbnf.h"

namespace thermocline::grammar {
namespace {

using Json = nlohmann::ordered_json;

// The JSON building blocks every compiled schema may use.
constexpr const char* kPrimitives = R"(ws ::= " "?
json-char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ([0-9] | [1-9] [0-9]{1,15})
json-number ::= json-int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-member ::= json-string ":" ws json-value
json-object ::= "{" (json-member ("," ws json-member)*)? "}"
json-array ::= "[" (json-value ("," ws json-value)*)? "]"
)";

// Keywords that constrain values in ways the compiler does not express: refused by name.
constexpr const char* kUnsupported[] = {
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "allOf", "not", "if", "then", "else", "prefixItems", "contains",
    "minContains", "maxContains", "uniqueItems", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "dependentRequired", "dependentSchemas",
    "dependencies", "unevaluatedProperties", "unevaluatedItems", "contentEncoding",
    "contentMediaType", "$dynamicRef", "$recursiveRef", "additionalItems"};

constexpr int kMaxDepth = 64;

// A GBNF string literal for `s` (UTF-8 kept, quotes, backslashes and controls escaped).
std::string Literal(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

class Compiler {
 public:
  explicit Compiler(const Json& root) : root_(root) {}

  absl::StatusOr<std::string> Run() {
    std::string body;
    if (absl::Status s = Compile(root_, "$", 0, &body); !s.ok()) return s;
    std::string out = absl::StrCat("root ::= ", body, "\n");
    for (const auto& [name, rule] : rules_) absl::StrAppend(&out, name, " ::= ", rule, "\n");
    return out + kPrimitives;
  }

 private:
  static absl::Status Refuse(const std::string& what, const std::string& path) {
    return absl::InvalidArgumentError(absl::StrCat(what, " at ", path, " is not supported"));
  }
  static absl::Status Invalid(const std::string& what, const std::string& path) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  }

  std::string NewRule(std::string body) {
    std::string name = absl::StrCat("s", rules_.size() + 1);
    rules_.emplace(name, std::move(body));
    return name;
  }

  // The GBNF expression for `schema` into *out.
  absl::Status Compile(const Json& schema, const std::string& path, int depth, std::string* out) {
    if (depth > kMaxDepth) return Invalid(absl::StrCat("nests deeper than ", kMaxDepth), path);
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) return Refuse("the schema false (it matches nothing)", path);
      *out = "json-value";
      return absl::OkStatus();
    }
    if (!schema.is_object()) return Invalid("a schema must be an object or a boolean", path);
    for (const char* k : kUnsupported) {
      if (schema.contains(k)) return Refuse(k, path);
    }
    if (auto it = schema.find("$ref"); it != schema.end()) {
      return CompileRef(*it, path, depth, out);
    }
    if (auto it = schema.find("const"); it != schema.end()) {
      *out = Literal(it->dump());
      return absl::OkStatus();
    }
    if (auto it = schema.find("enum"); it != schema.end()) {
      if (!it->is_array() || it->empty()) {
        return Invalid("enum must be a non-empty array", path + ".enum");
      }
      std::vector<std::string> alts;
      for (const Json& v : *it) alts.push_back(Literal(v.dump()));
      *out = absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
      return absl::OkStatus();
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      auto it = schema.find(key);
      if (it == schema.end()) continue;
      if (!it->is_array() || it->empty()) {
        return Invalid(absl::StrCat(key, " must be a non-empty array"), path + "." + key);
      }
      std::vector<std::string> alts;
      for (size_t i = 0; i < it->size(); ++i) {
        std::string alt;
        if (absl::Status s = Compile((*it)[i], absl::StrCat(path, ".", key, "[", i, "]"),
                                     depth + 1, &alt);
            !s.ok()) {
          return s;
        }
        alts.push_back(std::move(alt));
      }
      *out = absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
      return absl::OkStatus();
    }
    auto type = schema.find("type");
    if (type == schema.end()) {
      // No type: what the other keywords imply, else any value.
      if (schema.contains("properties") || schema.contains("additionalProperties") ||
          schema.contains("required")) {
        return CompileType("object", schema, path, depth, out);
      }
      if (schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems")) {
        return CompileType("array", schema, path, depth, out);
      }
      *out = "json-value";
      return absl::OkStatus();
    }
    if (type->is_string()) return CompileType(type->get<std::string>(), schema, path, depth, out);
    if (type->is_array() && !type->empty()) {
      std::vector<std::string> alts;
      for (const Json& t : *type) {
        if (!t.is_string()) return Invalid("type must hold strings", path + ".type");
        std::string alt;
        if (absl::Status s = CompileType(t.get<std::string>(), schema, path, depth, &alt); !s.ok()) {
          return s;
        }
        alts.push_back(std::move(alt));
      }
      *out = absl::StrCat("(", absl::StrJoin(alts, " | "), ")");
      return absl::OkStatus();
    }
    return Invalid("type must be a string or a non-empty array of strings", path + ".type");
  }

  absl::Status CompileRef(const Json& ref, const std::string& path, int depth, std::string* out) {
    if (!ref.is_string()) return Invalid("$ref must be a string", path + ".$ref");
    const std::string r = ref.get<std::string>();
    if (auto it = ref_rules_.find(r); it != ref_rules_.end()) {
      *out = it->second;
      return absl::OkStatus();
    }
    const Json* target = nullptr;
    if (r == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (r.compare(0, p.size(), p) != 0) continue;
        const std::string section = p.substr(2, p.size() - 3);
        const std::string name = r.substr(p.size());
        auto defs = root_.find(section);
        if (defs != root_.end() && defs->is_object()) {
          if (auto d = defs->find(name); d != defs->end()) target = &*d;
        }
        if (target == nullptr) {
          return Invalid(absl::StrCat("$ref \"", r, "\" names no schema in ", section),
                         path + ".$ref");
        }
      }
    }
    if (target == nullptr) {
      return Refuse(absl::StrCat("$ref \"", r, "\" (only #, #/$defs/NAME and #/definitions/NAME)"),
                    path + ".$ref");
    }
    // The rule's name first, so that a recursive reference finds it.
    const std::string name = absl::StrCat("ref", ref_rules_.size() + 1);
    ref_rules_.emplace(r, name);
    std::string body;
    const std::string at = r == "#" ? "$" : "$" + absl::StrReplaceAll(r.substr(1), {{"/", "."}});
    if (absl::Status s = Compile(*target, at, depth + 1, &body); !s.ok()) return s;
    rules_.emplace(name, std::move(body));
    *out = name;
    return absl::OkStatus();
  }

  absl::Status CompileType(const std::string& type, const Json& schema, const std::string& path,
                           int depth, std::string* out) {
    if (type == "string") return CompileString(schema, path, out);
    if (type == "integer") {
      *out = "json-int";
    } else if (type == "number") {
      *out = "json-number";
    } else if (type == "boolean") {
      *out = "json-boolean";
    } else if (type == "null") {
      *out = "json-null";
    } else if (type == "object") {
      return CompileObject(schema, path, depth, out);
    } else if (type == "array") {
      return CompileArray(schema, path, depth, out);
    } else {
      return Invalid(absl::StrCat("unknown type \"", type, "\""), path + ".type");
    }
    return absl::OkStatus();
  }

  absl::Status Count(const Json& schema, const char* key, const std::string& path, int64_t* v) {
    auto it = schema.find(key);
    if (it == schema.end()) return absl::OkStatus();
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Invalid(absl::StrCat(key, " must be a non-negative integer"), path + "." + key);
    }
    if (it->get<int64_t>() > kMaxRepetition) {
      return Refuse(absl::StrCat(key, " above ", kMaxRepetition), path + "." + key);
    }
    *v = it->get<int64_t>();
    return absl::OkStatus();
  }

  absl::Status CompileString(const Json& schema, const std::string& path, std::string* out) {
    int64_t lo = 0, hi = -1;
    if (absl::Status s = Count(schema, "minLength", path, &lo); !s.ok()) return s;
    if (absl::Status s = Count(schema, "maxLength", path, &hi); !s.ok()) return s;
    if (hi >= 0 && hi < lo) return Invalid("maxLength is below minLength", path);
    if (lo == 0 && hi < 0) {
      *out = "json-string";
    } else {
      *out = absl::StrCat("\"\\\"\" json-char{", lo, ",", hi < 0 ? "" : absl::StrCat(hi),
                          "} \"\\\"\"");
    }
    return absl::OkStatus();
  }

  absl::Status CompileArray(const Json& schema, const std::string& path, int depth,
                            std::string* out) {
    std::string item = "json-value";
    if (auto it = schema.find("items"); it != schema.end()) {
      if (it->is_array()) return Refuse("items as an array (tuple)", path + ".items");
      if (absl::Status s = Compile(*it, path + ".items", depth + 1, &item); !s.ok()) return s;
    }
    int64_t lo = 0, hi = -1;
    if (absl::Status s = Count(schema, "minItems", path, &lo); !s.ok()) return s;
    if (absl::Status s = Count(schema, "maxItems", path, &hi); !s.ok()) return s;
    if (hi >= 0 && hi < lo) return Invalid("maxItems is below minItems", path);
    if (hi == 0) {
      *out = "\"[\" \"]\"";
      return absl::OkStatus();
    }
    const std::string rest_max = hi < 0 ? "" : absl::StrCat(hi - 1);
    const std::string more = absl::StrCat("(\",\" ws ", item, "){", lo == 0 ? 0 : lo - 1, ",",
                                          rest_max, "}");
    const std::string body = absl::StrCat(item, " ", more);
    *out = NewRule(lo == 0 ? absl::StrCat("\"[\" (", body, ")? \"]\"")
                           : absl::StrCat("\"[\" ", body, " \"]\""));
    return absl::OkStatus();
  }

  absl::Status CompileObject(const Json& schema, const std::string& path, int depth,
                             std::string* out) {
    const Json* props = nullptr;
    if (auto it = schema.find("properties"); it != schema.end()) {
      if (!it->is_object()) return Invalid("properties must be an object", path + ".properties");
      props = &*it;
    }
    std::vector<std::string> required;
    if (auto it = schema.find("required"); it != schema.end()) {
      if (!it->is_array()) return Invalid("required must be an array", path + ".required");
      for (const Json& r : *it) {
        if (!r.is_string()) return Invalid("required must hold strings", path + ".required");
        required.push_back(r.get<std::string>());
      }
    }
    const Json* extra = nullptr;  // additionalProperties as a schema
    if (auto it = schema.find("additionalProperties"); it != schema.end()) {
      if (it->is_object()) {
        extra = &*it;
      } else if (!it->is_boolean()) {
        return Invalid("additionalProperties must be a boolean or a schema",
                       path + ".additionalProperties");
      }
    }
    const bool closed = schema.contains("additionalProperties") &&
                        schema["additionalProperties"].is_boolean() &&
                        !schema["additionalProperties"].get<bool>();
    if ((props == nullptr || props->empty()) && required.empty()) {
      if (closed) {
        *out = "\"{\" \"}\"";
        return absl::OkStatus();
      }
      // A map: any keys, values of the additionalProperties schema (or any value).
      std::string value = "json-value";
      if (extra != nullptr) {
        if (absl::Status s = Compile(*extra, path + ".additionalProperties", depth + 1, &value);
            !s.ok()) {
          return s;
        }
      }
      const std::string member = absl::StrCat("json-string \":\" ws ", value);
      *out = NewRule(absl::StrCat("\"{\" (", member, " (\",\" ws ", member, ")*)? \"}\""));
      return absl::OkStatus();
    }
    // Properties in order; required ones always, optional ones maybe. A required name with no
    // schema in properties takes any value, after the listed ones.
    struct Prop {
      std::string kv;
      bool required;
    };
    std::vector<Prop> list;
    auto is_required = [&](const std::string& k) {
      return std::find(required.begin(), required.end(), k) != required.end();
    };
    if (props != nullptr) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        std::string value;
        if (absl::Status s = Compile(it.value(), absl::StrCat(path, ".properties.", it.key()),
                                     depth + 1, &value);
            !s.ok()) {
          return s;
        }
        list.push_back({absl::StrCat(Literal(Json(it.key()).dump()), " \":\" ws ", value),
                        is_required(it.key())});
      }
    }
    for (const std::string& r : required) {
      if (props == nullptr || !props->contains(r)) {
        list.push_back({absl::StrCat(Literal(Json(r).dump()), " \":\" ws json-value"), true});
      }
    }
    // rest(i, first): the members from i on; `first`: none written yet (no comma before).
    std::string next_first, next_after;  // rest(i + 1, ...), built from the end
    for (size_t k = list.size(); k-- > 0;) {
      const Prop& p = list[k];
      const std::string tail_after = next_after.empty() ? "" : " " + next_after;
      std::string first = absl::StrCat(p.kv, tail_after);
      std::string after = absl::StrCat("\",\" ws ", p.kv, tail_after);
      if (!p.required) {
        first = absl::StrCat(first, " | ", next_first.empty() ? "\"\"" : next_first);
        after = absl::StrCat(after, " | ", next_after.empty() ? "\"\"" : next_after);
      }
      next_first = NewRule(first);
      next_after = NewRule(after);
    }
    *out = NewRule(absl::StrCat("\"{\" ", next_first, " \"}\""));
    return absl::OkStatus();
  }

  const Json& root_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> ref_rules_;  // $ref -> its rule
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToGbnf(std::string_view schema_json) {
  Json schema;
  try {
    schema = Json::parse(schema_json);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the schema is not valid JSON: ", e.what()));
  }
  absl::StatusOr<std::string> gbnf = Compiler(schema).Run();
  if (!gbnf.ok()) return gbnf.status();
  // Every schema compiles to a grammar the parser takes, or the compiler has a bug; a $ref
  // cycle that matches no character first (left recursion) is the schema's fault.
  if (absl::StatusOr<Grammar> g = ParseGbnf(*gbnf); !g.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the schema does not compile to a usable grammar: ", g.status().message()));
  }
  return gbnf;
}

std::string JsonObjectGbnf() { return absl::StrCat("root ::= json-object\n", kPrimitives); }

}  // namespace thermocline::grammar
