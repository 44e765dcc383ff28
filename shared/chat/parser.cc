#include "shared/chat/parser.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "shared/chat/builtins.h"
#include "shared/chat/lexer.h"

namespace thermocline::chat {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body ParseAll() {
    std::string end;
    Body body = ParseBody({}, end);
    if (!unknown_.empty()) Fail(unknown_[0].first, unknown_[0].second);
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxParseDepth) {
        p.Fail(p.Cur(), "template nests deeper than " + std::to_string(kMaxParseDepth) + " levels");
      }
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek(size_t n = 1) const {
    return toks_[pos_ + n < toks_.size() ? pos_ + n : toks_.size() - 1];
  }
  void Next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }

  [[noreturn]] void Fail(const Token& t, const std::string& message) const {
    TemplateError e(absl::StatusCode::kInvalidArgument, message);
    e.set_position(t.line, t.column);
    throw e;
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kText:
        return "text";
      case TokenType::kVarBegin:
        return "'{{'";
      case TokenType::kVarEnd:
        return "'}}'";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kName:
        return absl::StrCat("\'", t.text, "'");
      case TokenType::kString:
        return "string literal";
      case TokenType::kInt:
      case TokenType::kFloat:
        return "number " + t.text;
      case TokenType::kOp:
        return absl::StrCat("\'", t.text, "'");
      case TokenType::kEof:
        return "end of template";
    }
    return "token";
  }

  bool IsOp(const char* op) const { return Cur().type == TokenType::kOp && Cur().text == op; }
  bool IsName(const char* name) const {
    return Cur().type == TokenType::kName && Cur().text == name;
  }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Fail(Cur(), std::string("expected '") + op + "', got " + Describe(Cur()));
    Next();
  }
  std::string ExpectName(const char* what) {
    if (Cur().type != TokenType::kName) {
      Fail(Cur(), std::string("expected ") + what + ", got " + Describe(Cur()));
    }
    std::string n = Cur().text;
    Next();
    return n;
  }
  void ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) {
      Fail(Cur(), "expected end of statement '%}', got " + Describe(Cur()));
    }
    Next();
  }

  template <typename T>
  static std::unique_ptr<T> At(const Token& t) {
    auto n = std::make_unique<T>();
    n->line = t.line;
    n->column = t.column;
    return n;
  }
  ExprPtr MakeExpr(Expr::Kind kind, const Token& t) {
    ExprPtr e = At<Expr>(t);
    e->kind = kind;
    return e;
  }

  // Statements up to one of `ends` (the name after `{%`, which is consumed; `end` gets it).
  Body ParseBody(std::initializer_list<const char*> ends, std::string& end) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case TokenType::kText: {
          NodePtr n = At<Node>(t);
          n->kind = Node::Kind::kText;
          n->text = t.text;
          body.push_back(std::move(n));
          Next();
          break;
        }
        case TokenType::kVarBegin: {
          NodePtr n = At<Node>(t);
          n->kind = Node::Kind::kOutput;
          Next();
          n->expr = ParseTuple(true);
          if (Cur().type != TokenType::kVarEnd) {
            Fail(Cur(), "expected end of print statement '}}', got " + Describe(Cur()));
          }
          Next();
          body.push_back(std::move(n));
          break;
        }
        case TokenType::kBlockBegin: {
          Next();
          const Token& name = Cur();
          if (name.type != TokenType::kName) Fail(name, "expected a tag name after '{%'");
          for (const char* e : ends) {
            if (name.text == e) {
              end = e;
              Next();
              return body;
            }
          }
          body.push_back(ParseStatement());
          break;
        }
        case TokenType::kEof: {
          if (ends.size() > 0) {
            std::string want;
            for (const char* e : ends)
              want += std::string(want.empty() ? "" : " or ") + absl::StrCat("\'", e, "'");
            Fail(t, "unexpected end of template: expected " + want);
          }
          return body;
        }
        default:
          Fail(t, "unexpected " + Describe(t));
      }
    }
  }

  NodePtr ParseStatement() {
    const Token& t = Cur();
    const std::string& tag = t.text;
    if (tag == "for") return ParseFor();
    if (tag == "if") return ParseIf();
    if (tag == "set") return ParseSet();
    if (tag == "macro") return ParseMacro();
    if (tag == "filter") return ParseFilterBlock();
    if (tag == "with") return ParseWith();
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) Fail(t, absl::StrCat("\'", tag, "' outside of a loop"));
      NodePtr n = At<Node>(t);
      n->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      Next();
      ExpectBlockEnd();
      return n;
    }
    static const char* const kUnsupported[] = {"call",  "include",    "import", "from", "extends",
                                               "block", "autoescape", "do",     "trans"};
    for (const char* u : kUnsupported) {
      if (tag == u) Fail(t, "the '" + tag + "' tag is not supported in chat templates");
    }
    Fail(t, "unknown tag '" + tag + "'");
  }

  // Assignment targets: a name, or names separated by commas (optionally in parentheses).
  void ParseTargets(Node& n) {
    bool parens = false;
    if (IsOp("(")) {
      parens = true;
      n.tuple_target = true;
      Next();
    }
    n.targets.push_back(ExpectName("a variable name"));
    while (IsOp(",")) {
      n.tuple_target = true;
      Next();
      if (parens && IsOp(")")) break;
      if (Cur().type != TokenType::kName) break;
      n.targets.push_back(ExpectName("a variable name"));
    }
    if (parens) ExpectOp(")");
    for (const std::string& name : n.targets) {
      if (name == "true" || name == "false" || name == "none" || name == "True" ||
          name == "False" || name == "None") {
        Fail(Cur(), "cannot assign to '" + name + "'");
      }
    }
  }

  NodePtr ParseFor() {
    NodePtr n = At<Node>(Cur());
    SoftScope hard(*this, false);
    n->kind = Node::Kind::kFor;
    Next();
    ParseTargets(*n);
    if (!IsName("in")) Fail(Cur(), "expected 'in' in a for loop, got " + Describe(Cur()));
    Next();
    n->expr = ParseTuple(false);
    if (IsName("if")) {
      Next();
      n->loop_filter = ParseExpression(true);
    }
    if (IsName("recursive")) Fail(Cur(), "recursive loops are not supported");
    ExpectBlockEnd();
    ++loop_depth_;
    std::string end;
    n->body = ParseBody({"endfor", "else"}, end);
    --loop_depth_;
    if (end == "else") {
      ExpectBlockEnd();
      n->else_body = ParseBody({"endfor"}, end);
    }
    ExpectBlockEnd();
    return n;
  }

  // Jinja2 checks filter and test names when compiling, except directly inside an `if` (its
  // test and bodies) or a conditional expression, where an unknown name fails only when run.
  struct SoftScope {
    SoftScope(Parser& p, bool soft) : p(p), saved(p.soft_) { p.soft_ = soft; }
    ~SoftScope() { p.soft_ = saved; }
    Parser& p;
    bool saved;
  };

  void UnknownName(const Token& t, const std::string& message) {
    if (!soft_) unknown_.emplace_back(t, message);
  }

  NodePtr ParseIf() {
    NodePtr n = At<Node>(Cur());
    n->kind = Node::Kind::kIf;
    Next();
    SoftScope soft(*this, true);
    ExprPtr cond = ParseTuple(false);
    while (true) {
      ExpectBlockEnd();
      std::string end;
      Body body = ParseBody({"elif", "else", "endif"}, end);
      n->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = ParseTuple(false);
        continue;
      }
      if (end == "else") {
        ExpectBlockEnd();
        n->branches.emplace_back(nullptr, ParseBody({"endif"}, end));
      }
      ExpectBlockEnd();
      return n;
    }
  }

  NodePtr ParseSet() {
    NodePtr n = At<Node>(Cur());
    SoftScope hard(*this, soft_);
    Next();
    if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().text == ".") {
      n->targets.push_back(ExpectName("a variable name"));
      Next();
      n->attr = ExpectName("an attribute name");
    } else {
      ParseTargets(*n);
    }
    if (IsOp("=")) {
      Next();
      n->kind = Node::Kind::kSet;
      n->expr = ParseTuple(true);
      ExpectBlockEnd();
      return n;
    }
    if (n->tuple_target || !n->attr.empty()) {
      Fail(Cur(), "expected '=' after the assignment target");
    }
    n->kind = Node::Kind::kSetBlock;
    soft_ = false;
    while (IsOp("|")) {
      Next();
      n->filters.push_back(ParseFilterCall(nullptr));
    }
    ExpectBlockEnd();
    std::string end;
    n->body = ParseBody({"endset"}, end);
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseMacro() {
    NodePtr n = At<Node>(Cur());
    SoftScope hard(*this, false);
    n->kind = Node::Kind::kMacro;
    Next();
    n->name = ExpectName("a macro name");
    ExpectOp("(");
    bool had_default = false;
    while (!IsOp(")")) {
      if (!n->params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      std::string param = ExpectName("a parameter name");
      ExprPtr def;
      if (IsOp("=")) {
        Next();
        def = ParseExpression(true);
        had_default = true;
      } else if (had_default) {
        Fail(Cur(), "parameter '" + param + "' without a default follows one with a default");
      }
      for (const auto& p : n->params) {
        if (p.first == param) Fail(Cur(), "duplicate parameter '" + param + "'");
      }
      n->params.emplace_back(std::move(param), std::move(def));
    }
    Next();
    ExpectBlockEnd();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    n->body = ParseBody({"endmacro"}, end);
    loop_depth_ = saved_loops;
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseFilterBlock() {
    NodePtr n = At<Node>(Cur());
    SoftScope hard(*this, false);
    n->kind = Node::Kind::kFilterBlock;
    Next();
    n->filters.push_back(ParseFilterCall(nullptr));
    while (IsOp("|")) {
      Next();
      n->filters.push_back(ParseFilterCall(nullptr));
    }
    ExpectBlockEnd();
    std::string end;
    n->body = ParseBody({"endfilter"}, end);
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseWith() {
    NodePtr n = At<Node>(Cur());
    SoftScope hard(*this, false);
    n->kind = Node::Kind::kWith;
    Next();
    while (Cur().type != TokenType::kBlockEnd) {
      if (!n->targets.empty()) ExpectOp(",");
      n->targets.push_back(ExpectName("a variable name"));
      ExpectOp("=");
      n->values.push_back(ParseExpression(true));
    }
    ExpectBlockEnd();
    std::string end;
    n->body = ParseBody({"endwith"}, end);
    ExpectBlockEnd();
    return n;
  }

  // ---- expressions ----

  // `a, b` without parentheses is a tuple.
  ExprPtr ParseTuple(bool with_condexpr) {
    const Token& t = Cur();
    ExprPtr first = ParseExpression(with_condexpr);
    if (!IsOp(",")) return first;
    ExprPtr tuple = MakeExpr(Expr::Kind::kTuple, t);
    tuple->args.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (!StartsExpression()) break;
      tuple->args.push_back(ParseExpression(with_condexpr));
    }
    return tuple;
  }

  bool StartsExpression() const {
    const Token& t = Cur();
    switch (t.type) {
      case TokenType::kName:
      case TokenType::kString:
      case TokenType::kInt:
      case TokenType::kFloat:
        return true;
      case TokenType::kOp:
        return t.text == "(" || t.text == "[" || t.text == "{" || t.text == "-" || t.text == "+";
      default:
        return false;
    }
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  ExprPtr ParseCondExpr() {
    const Token& t = Cur();
    const size_t unknown_before = unknown_.size();
    ExprPtr expr = ParseOr();
    while (IsName("if")) {
      Next();
      ExprPtr cond = ParseOr();
      ExprPtr otherwise;
      if (IsName("else")) {
        Next();
        DepthGuard guard(*this);
        otherwise = ParseCondExpr();
      }
      unknown_.resize(unknown_before);  // a conditional expression checks names at run time
      ExprPtr c = MakeExpr(Expr::Kind::kCond, t);
      c->args.push_back(std::move(expr));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr Binary(Expr::Kind kind, const Token& t, ExprPtr a, ExprPtr b, std::string op = "") {
    ExprPtr e = MakeExpr(kind, t);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (IsName("or")) {
      const Token& t = Cur();
      Next();
      left = Binary(Expr::Kind::kOr, t, std::move(left), ParseAnd());
    }
    return left;
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (IsName("and")) {
      const Token& t = Cur();
      Next();
      left = Binary(Expr::Kind::kAnd, t, std::move(left), ParseNot());
    }
    return left;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      const Token& t = Cur();
      Next();
      DepthGuard guard(*this);
      ExprPtr e = MakeExpr(Expr::Kind::kNot, t);
      e->args.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const Token& t = Cur();
    ExprPtr first = ParseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == ">" ||
           Cur().text == "<=" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = MakeExpr(Expr::Kind::kCompare, t);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(ParseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& t = Cur();
      std::string op = t.text;
      Next();
      left = Binary(Expr::Kind::kBinary, t, std::move(left), ParseConcat(), op);
    }
    return left;
  }

  ExprPtr ParseConcat() {
    const Token& t = Cur();
    ExprPtr first = ParseMath2();
    if (!IsOp("~")) return first;
    ExprPtr c = MakeExpr(Expr::Kind::kConcat, t);
    c->args.push_back(std::move(first));
    while (IsOp("~")) {
      Next();
      c->args.push_back(ParseMath2());
    }
    return c;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& t = Cur();
      std::string op = t.text;
      Next();
      left = Binary(Expr::Kind::kBinary, t, std::move(left), ParsePow(), op);
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (IsOp("**")) {
      const Token& t = Cur();
      Next();
      left = Binary(Expr::Kind::kBinary, t, std::move(left), ParseUnary(true), "**");
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(*this);
    const Token& t = Cur();
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = t.text == "-";
      Next();
      node = MakeExpr(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, t);
      node->args.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Cur();
    switch (t.type) {
      case TokenType::kName: {
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral, t);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        Next();
        return e;
      }
      case TokenType::kString: {
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral, t);
        std::string s;
        while (Cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += Cur().text;
          Next();
        }
        e->literal = Value::Str(std::move(s));
        return e;
      }
      case TokenType::kInt: {
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral, t);
        e->literal = Value::Int(t.int_value);
        Next();
        return e;
      }
      case TokenType::kFloat: {
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral, t);
        e->literal = Value::Float(t.float_value);
        Next();
        return e;
      }
      case TokenType::kOp:
        if (t.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return MakeExpr(Expr::Kind::kTuple, t);
          }
          ExprPtr first = ParseExpression(true);
          if (IsOp(")")) {
            Next();
            return first;
          }
          ExprPtr tuple = MakeExpr(Expr::Kind::kTuple, t);
          tuple->args.push_back(std::move(first));
          while (IsOp(",")) {
            Next();
            if (IsOp(")")) break;
            tuple->args.push_back(ParseExpression(true));
          }
          ExpectOp(")");
          return tuple;
        }
        if (t.text == "[") {
          ExprPtr list = MakeExpr(Expr::Kind::kList, t);
          Next();
          while (!IsOp("]")) {
            if (!list->args.empty()) ExpectOp(",");
            if (IsOp("]")) break;
            list->args.push_back(ParseExpression(true));
          }
          Next();
          return list;
        }
        if (t.text == "{") {
          ExprPtr dict = MakeExpr(Expr::Kind::kDict, t);
          Next();
          while (!IsOp("}")) {
            if (!dict->args.empty()) ExpectOp(",");
            if (IsOp("}")) break;
            dict->args.push_back(ParseExpression(true));
            ExpectOp(":");
            dict->args.push_back(ParseExpression(true));
          }
          Next();
          return dict;
        }
        break;
      default:
        break;
    }
    Fail(t, "unexpected " + Describe(t) + " in an expression");
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      const Token& t = Cur();
      if (IsOp(".")) {
        Next();
        if (Cur().type == TokenType::kName) {
          ExprPtr e = MakeExpr(Expr::Kind::kGetAttr, t);
          e->name = Cur().text;
          e->args.push_back(std::move(node));
          Next();
          node = std::move(e);
        } else if (Cur().type == TokenType::kInt) {
          ExprPtr e = MakeExpr(Expr::Kind::kGetItem, t);
          e->args.push_back(std::move(node));
          ExprPtr key = MakeExpr(Expr::Kind::kLiteral, Cur());
          key->literal = Value::Int(Cur().int_value);
          e->args.push_back(std::move(key));
          Next();
          node = std::move(e);
        } else {
          Fail(Cur(), "expected an attribute name after '.', got " + Describe(Cur()));
        }
      } else if (IsOp("[")) {
        Next();
        node = ParseSubscript(std::move(node), t);
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node), t);
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node, const Token& t) {
    ExprPtr parts[3];
    int colons = 0;
    if (!IsOp(":")) parts[0] = ParseExpression(true);
    if (IsOp(",")) {  // a[x, y]: the key is a tuple
      ExprPtr tuple = MakeExpr(Expr::Kind::kTuple, t);
      tuple->args.push_back(std::move(parts[0]));
      while (IsOp(",")) {
        Next();
        if (IsOp("]")) break;
        tuple->args.push_back(ParseExpression(true));
      }
      parts[0] = std::move(tuple);
    }
    while (IsOp(":") && colons < 2) {
      Next();
      ++colons;
      if (!IsOp(":") && !IsOp("]")) parts[colons] = ParseExpression(true);
    }
    ExpectOp("]");
    if (colons == 0) {
      ExprPtr e = MakeExpr(Expr::Kind::kGetItem, t);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    ExprPtr e = MakeExpr(Expr::Kind::kSlice, t);
    e->args.push_back(std::move(node));
    for (ExprPtr& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  void ParseCallArgs(Expr& call) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) Fail(Cur(), "*args and **kwargs in calls are not supported");
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        for (const auto& kw : call.kwargs) {
          if (kw.first == key) Fail(Cur(), "keyword argument '" + key + "' repeated");
        }
        call.kwargs.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!call.kwargs.empty()) Fail(Cur(), "positional argument follows keyword argument");
        call.args.push_back(ParseExpression(true));
      }
    }
    Next();
  }

  ExprPtr ParseCall(ExprPtr callee, const Token& t) {
    ExprPtr e = MakeExpr(Expr::Kind::kCall, t);
    e->args.push_back(std::move(callee));
    ParseCallArgs(*e);
    return e;
  }

  std::string ParseDottedName(const char* what) {
    std::string name = ExpectName(what);
    while (IsOp(".") && Peek().type == TokenType::kName) {
      Next();
      name += "." + Cur().text;
      Next();
    }
    return name;
  }

  ExprPtr ParseFilterCall(ExprPtr subject) {
    const Token& t = Cur();
    ExprPtr f = MakeExpr(Expr::Kind::kFilter, t);
    f->name = ParseDottedName("a filter name");
    if (!IsKnownFilter(f->name)) UnknownName(t, "no filter named '" + f->name + "'");
    f->args.push_back(std::move(subject));
    if (IsOp("(")) ParseCallArgs(*f);
    return f;
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        Next();
        node = ParseFilterCall(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node), Cur());
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseTest(ExprPtr node) {
    const Token& is = Cur();
    Next();
    ExprPtr e = MakeExpr(Expr::Kind::kTest, is);
    if (IsName("not")) {
      e->negated = true;
      Next();
    }
    const Token& name_tok = Cur();
    e->name = ParseDottedName("a test name");
    if (!IsKnownTest(e->name)) UnknownName(name_tok, "no test named '" + e->name + "'");
    e->args.push_back(std::move(node));
    const Token& c = Cur();
    if (IsOp("(")) {
      ParseCallArgs(*e);
    } else if ((c.type == TokenType::kName || c.type == TokenType::kString ||
                c.type == TokenType::kInt || c.type == TokenType::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !(IsName("else") || IsName("or") || IsName("and"))) {
      if (IsName("is")) Fail(c, "tests cannot be chained with 'is'");
      ExprPtr arg = ParsePostfix(ParsePrimary());
      e->args.push_back(std::move(arg));
    }
    return e;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  bool soft_ = false;
  std::vector<std::pair<Token, std::string>> unknown_;  // unknown filters and tests, not soft
};

}  // namespace

Body ParseTemplate(std::string_view source) { return Parser(Tokenize(source)).ParseAll(); }

}  // namespace thermocline::chat
