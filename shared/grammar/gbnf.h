// GBNF (llama.cpp's grammar format, docs/gateway.md#structured-output) parsed into a flat
// grammar that the matcher (matcher.h) runs as a pushdown automaton over code points.
//
// Syntax: `name ::= alternatives` rules (names [a-zA-Z0-9_-]+, `root` is where matching
// starts); alternatives separated by `|`; sequences of string literals "..." (escapes \n \r \t
// \\ \" \' \[ \] \xHH \uHHHH \UHHHHHHHH), character classes [...] (ranges a-z, negation [^...],
// the same escapes), `.` (any code point), rule names and parenthesized groups, each optionally
// followed by `*`, `+`, `?`, `{m}`, `{m,}` or `{m,n}`; `#` comments to the end of the line. A
// newline ends a rule except inside parentheses. Repetitions become helper rules named after
// the rule they occur in (`root_3`).
//
// Refused, with the line and column: syntax errors, undefined rules, a missing root, repetition
// counts past kMaxRepetition, groups nested deeper than kMaxNesting, a start so ambiguous that
// expanding it exceeds matcher.h's kExpandBudget, and left recursion (a rule that can reach itself without
// consuming a character, which a top-down matcher would expand forever).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline::grammar {

// One element of a rule's flat body.
struct Element {
  enum Kind : uint8_t {
    kEnd,      // ends the rule's last alternative
    kAlt,      // ends an alternative; the next one starts after it
    kRuleRef,  // value: rule index
    kClass,    // value: index into Grammar::classes
  };
  Kind kind;
  uint32_t value;
};

// A set of code points: sorted, disjoint, inclusive ranges, possibly negated.
struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool negated = false;
  bool Matches(uint32_t cp) const;
  // Whether some code point in [lo, hi] matches.
  bool MatchesAnyIn(uint32_t lo, uint32_t hi) const;
};

struct Grammar {
  std::vector<Element> elements;      // every rule's body, one after another
  std::vector<uint32_t> rule_start;   // rule index -> offset of its first element
  std::vector<std::string> rule_names;
  std::vector<CharClass> classes;
  uint32_t root = 0;
};

inline constexpr int kMaxRepetition = 1000;   // {m,n} bounds
inline constexpr size_t kMaxGrammarElements = 1 << 20;
inline constexpr int kMaxNesting = 128;       // parenthesized groups inside each other

// Parses GBNF text. Errors read "line L, column C: <what>".
absl::StatusOr<Grammar> ParseGbnf(std::string_view text);

}  // namespace thermocline::grammar
