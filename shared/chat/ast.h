// The syntax tree of a parsed chat template: expressions and statements, each with the source
// position errors report.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shared/chat/value.h"

namespace thermocline::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: items
    kTuple,    // args: items
    kDict,     // args: key0, value0, key1, value1 ...
    kGetAttr,  // args[0] . name
    kGetItem,  // args[0] [ args[1] ]
    kSlice,    // args[0] [ args[1] : args[2] : args[3] ] (null where omitted)
    kCall,     // args[0] ( args[1..], kwargs )
    kFilter,   // args[0] | name ( args[1..], kwargs ); args[0] is null in a filter block
    kTest,     // args[0] is [not] name ( args[1..], kwargs ); negated
    kNeg,      // - args[0]
    kPos,      // + args[0]
    kNot,      // not args[0]
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kBinary,   // args[0] op args[1]; name is + - * / // % **
    kConcat,   // args joined with ~
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...
    kCond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: == != < > <= >= in notin
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches: (condition, body); a null condition is the else branch
    kFor,          // for targets in expr [if filter] body [else else_body]
    kSet,          // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    kSetBlock,     // set targets[0] [| filters] body endset
    kMacro,        // macro name(params) body endmacro
    kFilterBlock,  // filter filters body endfilter
    kWith,         // with targets[i] = values[i] body endwith
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr loop_filter;
  std::vector<std::string> targets;
  bool tuple_target = false;  // `for a, b in` / `set a, b =`: unpack the value
  std::string attr;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters, null: no default
  std::vector<ExprPtr> values;                          // with
  std::vector<ExprPtr> filters;                         // kFilter expressions with a null subject
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

}  // namespace thermocline::chat
