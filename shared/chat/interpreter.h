// Renders a parsed chat template: statements, expressions and scopes with Jinja2's semantics
// (a for-loop iteration and a macro call get their own scope; `if` does not), under step,
// output-size and recursion limits, since a template is untrusted input.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shared/chat/ast.h"
#include "shared/chat/value.h"

namespace thermocline::chat {

struct RenderLimits {
  // Evaluation steps (each node evaluated, each item copied by an operator or filter).
  int64_t max_steps = 5'000'000;
  // Bytes of the rendered prompt (and of any macro output or {% set %} block).
  size_t max_output_bytes = size_t{8} << 20;
  // Nested evaluation: statements, expressions and macro calls together.
  int max_depth = 400;
};

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* Lookup(std::string_view name) const;  // this scope, then its parents
  void Set(const std::string& name, Value v);        // this scope
};

class Interpreter {
 public:
  // `now_unix_seconds` is what strftime_now formats (in local time).
  Interpreter(const RenderLimits& limits, int64_t now_unix_seconds);
  ~Interpreter();

  // Renders `body` with `context` (the template's variables). Throws TemplateError.
  std::string Render(const Body& body, std::vector<std::pair<std::string, Value>> context);

  // For builtins: count work, and call a callable value.
  void Step(int64_t n = 1);
  int64_t now_unix_seconds() const { return now_; }
  Value CallMacro(const Node& macro, const std::weak_ptr<Scope>& scope, const CallArgs& args);
  // namespace() objects are cleared when rendering ends (they may reference each other).
  void Track(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct DepthGuard;

  Flow ExecBody(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow Exec(const Node& node, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow ExecFor(const Node& node, const std::shared_ptr<Scope>& scope, std::string& out);
  void ExecSet(const Node& node, const std::shared_ptr<Scope>& scope);
  void Append(std::string& out, std::string_view text);
  void Assign(const Node& node, const Value& v, Scope& scope);

  Value Eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value EvalImpl(const Expr& e, const std::shared_ptr<Scope>& scope);
  CallArgs EvalArgs(const Expr& e, const std::shared_ptr<Scope>& scope, size_t first);
  Value ApplyFilterExpr(const Expr& f, Value subject, const std::shared_ptr<Scope>& scope);

  RenderLimits limits_;
  int64_t now_;
  int64_t steps_ = 0;
  int depth_ = 0;
  std::vector<std::weak_ptr<Namespace>> namespaces_;
};

}  // namespace thermocline::chat
