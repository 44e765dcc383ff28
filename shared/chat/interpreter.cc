#include "shared/chat/interpreter.h"

#include "absl/strings/str_cat.h"
#include "shared/chat/builtins.h"
#include "shared/chat/operators.h"

namespace thermocline::chat {

namespace {

// A {% macro %}: renders its body in a fresh scope whose parent is the scope it was defined in
// (macros see the template's variables at call time, never the caller's).
class MacroFn : public Callable {
 public:
  MacroFn(const Node* node, std::weak_ptr<Scope> scope) : node_(node), scope_(std::move(scope)) {}
  std::string name() const override { return node_->name; }
  Value Call(Interpreter& interp, const CallArgs& args) const override {
    return interp.CallMacro(*node_, scope_, args);
  }

 private:
  const Node* node_;
  // Weak: the scope holds the macro, so a strong pointer would be a cycle.
  std::weak_ptr<Scope> scope_;
};

// loop.cycle(a, b, ...): the argument at loop.index0 modulo their count.
class CycleFn : public Callable {
 public:
  explicit CycleFn(int64_t index0) : index0_(index0) {}
  std::string name() const override { return "cycle"; }
  Value Call(Interpreter&, const CallArgs& args) const override {
    if (args.positional.empty()) ThrowError("no items for cycling given");
    return args.positional[static_cast<size_t>(index0_) % args.positional.size()];
  }

 private:
  int64_t index0_;
};

void Unpack(const std::vector<std::string>& names, const Value& v, Scope& scope) {
  std::vector<Value> items = Iterate(v);
  if (items.size() != names.size()) {
    ThrowError(items.size() < names.size()
                   ? "not enough values to unpack (expected " + std::to_string(names.size()) +
                         ", got " + std::to_string(items.size()) + ")"
                   : "too many values to unpack (expected " + std::to_string(names.size()) + ")");
  }
  for (size_t i = 0; i < names.size(); ++i) scope.Set(names[i], items[i]);
}

}  // namespace

const Value* Scope::Lookup(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::Set(const std::string& name, Value v) {
  for (auto& [k, old] : vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

struct Interpreter::DepthGuard {
  explicit DepthGuard(Interpreter& in) : in(in) {
    if (++in.depth_ > in.limits_.max_depth) {
      ThrowLimit("template recursion or nesting deeper than " +
                 std::to_string(in.limits_.max_depth));
    }
  }
  ~DepthGuard() { --in.depth_; }
  Interpreter& in;
};

Interpreter::Interpreter(const RenderLimits& limits, int64_t now_unix_seconds)
    : limits_(limits), now_(now_unix_seconds) {}

Interpreter::~Interpreter() {
  // Namespaces can hold each other (ns.a = ns2, ns2.b = ns): empty them to break the cycles.
  for (const auto& w : namespaces_) {
    if (auto ns = w.lock()) ns->attrs.clear();
  }
}

void Interpreter::Step(int64_t n) {
  if (n > limits_.max_steps - steps_) {
    ThrowLimit("template rendering took more than " + std::to_string(limits_.max_steps) + " steps");
  }
  steps_ += n;
}

std::string Interpreter::Render(const Body& body,
                                std::vector<std::pair<std::string, Value>> context) {
  auto globals = std::make_shared<Scope>();
  globals->vars = GlobalFunctions();
  auto root = std::make_shared<Scope>();
  root->parent = globals;
  root->vars = std::move(context);
  std::string out;
  ExecBody(body, root, out);
  // Macros are weakly bound to their scopes, values cannot outlive this call.
  root->vars.clear();
  return out;
}

void Interpreter::Append(std::string& out, std::string_view text) {
  if (out.size() + text.size() > limits_.max_output_bytes) {
    ThrowLimit("template output is longer than " + std::to_string(limits_.max_output_bytes) +
               " bytes");
  }
  out.append(text);
}

Interpreter::Flow Interpreter::ExecBody(const Body& body, const std::shared_ptr<Scope>& scope,
                                        std::string& out) {
  for (const NodePtr& n : body) {
    const Flow f = Exec(*n, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::Exec(const Node& node, const std::shared_ptr<Scope>& scope,
                                    std::string& out) {
  DepthGuard guard(*this);
  Step();
  try {
    switch (node.kind) {
      case Node::Kind::kText:
        Append(out, node.text);
        return Flow::kNormal;
      case Node::Kind::kOutput:
        Append(out, ToStr(Eval(*node.expr, scope)));
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (const auto& [cond, body] : node.branches) {
          if (cond == nullptr || Truthy(Eval(*cond, scope))) return ExecBody(body, scope, out);
        }
        return Flow::kNormal;
      case Node::Kind::kFor:
        return ExecFor(node, scope, out);
      case Node::Kind::kSet:
        ExecSet(node, scope);
        return Flow::kNormal;
      case Node::Kind::kSetBlock: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        std::string text;
        // A break or continue inside leaves the enclosing loop before anything is assigned.
        const Flow f = ExecBody(node.body, inner, text);
        if (f != Flow::kNormal) return f;
        Value v = Value::Str(std::move(text));
        for (const ExprPtr& fe : node.filters) v = ApplyFilterExpr(*fe, std::move(v), scope);
        scope->Set(node.targets[0], std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        scope->Set(node.name, Value::Func(std::make_shared<MacroFn>(&node, scope)));
        return Flow::kNormal;
      case Node::Kind::kFilterBlock: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        std::string text;
        const Flow f = ExecBody(node.body, inner, text);
        if (f != Flow::kNormal) return f;  // as in Jinja2, the filtered text is then dropped
        Value v = Value::Str(std::move(text));
        for (const ExprPtr& fe : node.filters) v = ApplyFilterExpr(*fe, std::move(v), scope);
        Append(out, ToStr(v));
        return Flow::kNormal;
      }
      case Node::Kind::kWith: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (size_t i = 0; i < node.targets.size(); ++i) {
          inner->Set(node.targets[i], Eval(*node.values[i], inner));
        }
        return ExecBody(node.body, inner, out);
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
  } catch (TemplateError& e) {
    if (!e.has_position()) e.set_position(node.line, node.column);
    throw;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecFor(const Node& node, const std::shared_ptr<Scope>& scope,
                                       std::string& out) {
  const Value seq = Eval(*node.expr, scope);
  std::vector<Value> items = Iterate(seq);
  Step(static_cast<int64_t>(items.size()));
  auto bind = [&](Scope& s, const Value& item) {
    if (node.tuple_target) {
      Unpack(node.targets, item, s);
    } else {
      s.Set(node.targets[0], item);
    }
  };
  if (node.loop_filter) {
    std::vector<Value> kept;
    for (Value& item : items) {
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      bind(*probe, item);
      if (Truthy(Eval(*node.loop_filter, probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (node.else_body.empty()) return Flow::kNormal;
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    // The else block is outside this loop: a break there ends the enclosing loop.
    return ExecBody(node.else_body, inner, out);
  }
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    bind(*inner, items[static_cast<size_t>(i)]);
    std::vector<std::pair<std::string, Value>> loop = {
        {"index", Value::Int(i + 1)},    {"index0", Value::Int(i)},
        {"revindex", Value::Int(n - i)}, {"revindex0", Value::Int(n - i - 1)},
        {"first", Value::Bool(i == 0)},  {"last", Value::Bool(i == n - 1)},
        {"length", Value::Int(n)},       {"depth", Value::Int(1)},
        {"depth0", Value::Int(0)},       {"cycle", Value::Func(std::make_shared<CycleFn>(i))},
    };
    loop.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                                        : Value::Undefined("there is no previous item"));
    loop.emplace_back("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)]
                                            : Value::Undefined("there is no next item"));
    inner->Set("loop", Value::Dict(std::move(loop)));
    const Flow f = ExecBody(node.body, inner, out);
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interpreter::ExecSet(const Node& node, const std::shared_ptr<Scope>& scope) {
  Value v = Eval(*node.expr, scope);
  if (!node.attr.empty()) {
    const Value* target = scope->Lookup(node.targets[0]);
    if (target == nullptr || target->kind() != Value::Kind::kNamespace) {
      ThrowError("cannot assign attribute on non-namespace object");
    }
    target->as_namespace().Set(node.attr, std::move(v));
    return;
  }
  if (node.tuple_target) {
    Unpack(node.targets, v, *scope);
  } else {
    scope->Set(node.targets[0], std::move(v));
  }
}

Value Interpreter::CallMacro(const Node& macro, const std::weak_ptr<Scope>& scope,
                             const CallArgs& args) {
  DepthGuard guard(*this);
  std::shared_ptr<Scope> parent = scope.lock();
  if (!parent) ThrowError("macro '" + macro.name + "' called after its scope ended");
  const size_t np = macro.params.size();
  if (args.positional.size() > np) {
    ThrowError("macro '" + macro.name + "' takes not more than " + std::to_string(np) +
               " argument(s)");
  }
  auto inner = std::make_shared<Scope>();
  inner->parent = parent;
  std::vector<const Value*> given(np, nullptr);
  for (size_t i = 0; i < args.positional.size(); ++i) given[i] = &args.positional[i];
  for (const auto& [k, v] : args.keyword) {
    size_t i = 0;
    while (i < np && macro.params[i].first != k) ++i;
    if (i == np) ThrowError("macro '" + macro.name + "' takes no keyword argument '" + k + "'");
    if (given[i] != nullptr) {
      ThrowError("macro '" + macro.name + "' got multiple values for argument '" + k + "'");
    }
    given[i] = &v;
  }
  for (size_t i = 0; i < np; ++i) {
    const auto& [name, def] = macro.params[i];
    if (given[i] != nullptr) {
      inner->Set(name, *given[i]);
    } else if (def != nullptr) {
      inner->Set(name, Eval(*def, inner));
    } else {
      inner->Set(name, Value::Undefined("parameter '" + name + "' was not provided"));
    }
  }
  std::string out;
  ExecBody(macro.body, inner, out);
  return Value::Str(std::move(out));
}

CallArgs Interpreter::EvalArgs(const Expr& e, const std::shared_ptr<Scope>& scope, size_t first) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(Eval(*e.args[i], scope));
  for (const auto& [k, x] : e.kwargs) args.keyword.emplace_back(k, Eval(*x, scope));
  return args;
}

Value Interpreter::ApplyFilterExpr(const Expr& f, Value subject,
                                   const std::shared_ptr<Scope>& scope) {
  CallArgs args = EvalArgs(f, scope, 1);
  try {
    return ApplyFilter(*this, f.name, subject, args);
  } catch (TemplateError& e) {
    if (!e.has_position()) e.set_position(f.line, f.column);
    throw;
  }
}

Value Interpreter::Eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  DepthGuard guard(*this);
  Step();
  try {
    return EvalImpl(e, scope);
  } catch (TemplateError& err) {
    if (!err.has_position()) err.set_position(e.line, e.column);
    throw;
  }
}

Value Interpreter::EvalImpl(const Expr& e, const std::shared_ptr<Scope>& scope) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName: {
      const Value* v = scope->Lookup(e.name);
      if (v != nullptr) return *v;
      return Value::Undefined(absl::StrCat("\'", e.name, "' is undefined"));
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const ExprPtr& x : e.args) items.push_back(Eval(*x, scope));
      return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      std::vector<std::pair<std::string, Value>> items;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = Eval(*e.args[i], scope);
        if (!k.is_string()) ThrowError("dict keys must be strings here, not " + TypeName(k));
        Value v = Eval(*e.args[i + 1], scope);
        bool replaced = false;
        for (auto& kv : items) {
          if (kv.first == k.as_string()) {
            kv.second = v;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(k.as_string(), std::move(v));
      }
      return Value::Dict(std::move(items));
    }
    case Expr::Kind::kGetAttr:
      return GetAttribute(Eval(*e.args[0], scope), e.name);
    case Expr::Kind::kGetItem: {
      Value obj = Eval(*e.args[0], scope);
      return GetItem(obj, Eval(*e.args[1], scope));
    }
    case Expr::Kind::kSlice: {
      Value obj = Eval(*e.args[0], scope);
      auto part = [&](size_t i) { return e.args[i] ? Eval(*e.args[i], scope) : Value::None(); };
      Value a = part(1);
      Value b = part(2);
      Value c = part(3);
      return GetSlice(obj, a, b, c);
    }
    case Expr::Kind::kCall: {
      Value callee = Eval(*e.args[0], scope);
      CallArgs args = EvalArgs(e, scope, 1);
      if (callee.kind() != Value::Kind::kCallable) {
        RequireDefined(callee);
        ThrowError(absl::StrCat("\'", TypeName(callee), "' object is not callable"));
      }
      return callee.as_callable().Call(*this, args);
    }
    case Expr::Kind::kFilter:
      return ApplyFilterExpr(e, Eval(*e.args[0], scope), scope);
    case Expr::Kind::kTest: {
      Value subject = Eval(*e.args[0], scope);
      CallArgs args = EvalArgs(e, scope, 1);
      const bool r = ApplyTest(*this, e.name, subject, args);
      return Value::Bool(e.negated ? !r : r);
    }
    case Expr::Kind::kNeg:
      return Negate(Eval(*e.args[0], scope));
    case Expr::Kind::kPos: {
      Value v = Eval(*e.args[0], scope);
      RequireDefined(v);
      if (!v.is_number()) ThrowError("bad operand type for unary +: '" + TypeName(v) + "'");
      return v.kind() == Value::Kind::kBool ? Value::Int(v.as_int()) : v;
    }
    case Expr::Kind::kNot:
      return Value::Bool(!Truthy(Eval(*e.args[0], scope)));
    case Expr::Kind::kAnd: {
      Value a = Eval(*e.args[0], scope);
      return Truthy(a) ? Eval(*e.args[1], scope) : a;
    }
    case Expr::Kind::kOr: {
      Value a = Eval(*e.args[0], scope);
      return Truthy(a) ? a : Eval(*e.args[1], scope);
    }
    case Expr::Kind::kBinary: {
      Value a = Eval(*e.args[0], scope);
      Value b = Eval(*e.args[1], scope);
      return BinaryOp(*this, e.name, a, b);
    }
    case Expr::Kind::kConcat: {
      std::string s;
      for (const ExprPtr& x : e.args) {
        s += ToStr(Eval(*x, scope));
        CheckStringSize(s.size());
      }
      return Value::Str(std::move(s));
    }
    case Expr::Kind::kCompare: {
      Value left = Eval(*e.args[0], scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = Eval(*e.args[i + 1], scope);
        if (!CompareOp(e.ops[i], left, right)) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case Expr::Kind::kCond:
      if (Truthy(Eval(*e.args[1], scope))) return Eval(*e.args[0], scope);
      if (e.args[2]) return Eval(*e.args[2], scope);
      return Value::Undefined(
          "the inline if expression evaluated to false and no else section was defined");
  }
  ThrowError("unknown expression");
}

}  // namespace thermocline::chat
