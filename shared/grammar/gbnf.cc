#include "shared/grammar/gbnf.h"

#include <algorithm>
#include <cctype>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shared/grammar/matcher.h"
#include "shared/tokenizer/utf8.h"

namespace thermocline::grammar {

bool CharClass::Matches(uint32_t cp) const {
  // Ranges are sorted and disjoint: the first range ending at or after cp decides.
  auto it = std::lower_bound(ranges.begin(), ranges.end(), cp,
                             [](const std::pair<uint32_t, uint32_t>& r, uint32_t c) {
                               return r.second < c;
                             });
  const bool in = it != ranges.end() && it->first <= cp;
  return in != negated;
}

bool CharClass::MatchesAnyIn(uint32_t lo, uint32_t hi) const {
  if (lo > hi) return false;
  if (!negated) {
    for (const auto& [a, b] : ranges) {
      if (a <= hi && b >= lo) return true;
    }
    return false;
  }
  // Negated: some point of [lo, hi] lies outside every range.
  uint32_t next = lo;
  for (const auto& [a, b] : ranges) {
    if (b < next) continue;
    if (a > next) return true;
    if (b >= hi) return false;
    next = b + 1;
  }
  return next <= hi;
}

namespace {

struct Sym {
  Element::Kind kind;  // kRuleRef or kClass
  uint32_t value;
};
using Seq = std::vector<Sym>;

struct RawRule {
  std::vector<Seq> alts;
  bool defined = false;
  size_t pos = 0;  // where it is defined (helper rules: the construct) or first referenced
};

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-';
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  absl::StatusOr<Grammar> Run() {
    SkipSpace(true);
    while (ok_ && p_ < s_.size()) {
      ParseRule();
      SkipSpace(true);
    }
    if (!ok_) return Error();
    for (size_t i = 0; i < rules_.size(); ++i) {
      if (!rules_[i].defined) {
        Fail(rules_[i].pos, absl::StrCat("rule '", names_[i], "' is used but not defined"));
        return Error();
      }
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) {
      Fail(0, "the grammar has no rule named 'root'");
      return Error();
    }
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    Grammar g = Flatten(root->second);
    if (InitialState(g).stacks.empty()) {
      Fail(rules_[root->second].pos,
           absl::StrCat("the grammar is too ambiguous: its start expands in more than ",
                        kExpandBudget, " steps"));
      return Error();
    }
    return g;
  }

 private:
  // --- errors ---
  void Fail(size_t pos, const std::string& what) {
    if (ok_) {
      ok_ = false;
      err_pos_ = std::min(pos, s_.size());
      err_ = what;
    }
  }
  absl::Status Error() const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < err_pos_; ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80) {
        ++col;  // columns count code points
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ", column ", col, ": ", err_));
  }

  bool At(char c) const { return p_ < s_.size() && s_[p_] == c; }

  // Spaces, tabs and comments; newlines too when `newlines` (inside parentheses, after | and
  // ::=, between rules).
  void SkipSpace(bool newlines) {
    while (p_ < s_.size()) {
      const char c = s_[p_];
      if (c == ' ' || c == '\t') {
        ++p_;
      } else if (c == '#') {
        while (p_ < s_.size() && s_[p_] != '\n') ++p_;
      } else if (newlines && (c == '\n' || c == '\r')) {
        ++p_;
      } else {
        break;
      }
    }
  }

  std::string ParseName() {
    const size_t start = p_;
    while (p_ < s_.size() && IsNameChar(s_[p_])) ++p_;
    return std::string(s_.substr(start, p_ - start));
  }

  uint32_t RuleId(const std::string& name, size_t pos) {
    auto [it, inserted] = ids_.try_emplace(name, static_cast<uint32_t>(rules_.size()));
    if (inserted) {
      rules_.emplace_back();
      rules_.back().pos = pos;
      names_.push_back(name);
    }
    return it->second;
  }

  // A helper rule for a group or repetition inside rule `parent`.
  uint32_t NewHelper(const std::string& parent, size_t pos) {
    std::string name;
    do {
      name = absl::StrCat(parent, "_", ++helper_count_);
    } while (ids_.contains(name));
    const uint32_t id = RuleId(name, pos);
    rules_[id].defined = true;
    return id;
  }

  void ParseRule() {
    const size_t start = p_;
    const std::string name = ParseName();
    if (name.empty()) {
      Fail(p_, "expected a rule name");
      return;
    }
    const uint32_t id = RuleId(name, start);
    if (rules_[id].defined) {
      Fail(start, absl::StrCat("rule '", name, "' is defined twice"));
      return;
    }
    rules_[id].defined = true;
    rules_[id].pos = start;
    SkipSpace(false);
    if (s_.substr(p_, 3) != "::=") {
      Fail(p_, absl::StrCat("expected ::= after the rule name '", name, "'"));
      return;
    }
    p_ += 3;
    SkipSpace(true);
    std::vector<Seq> alts = ParseAlternatives(name, false);
    if (!ok_) return;
    rules_[id].alts = std::move(alts);
    SkipSpace(false);
    if (p_ < s_.size() && s_[p_] != '\n' && s_[p_] != '\r') {
      Fail(p_, absl::StrCat("unexpected '", std::string(1, s_[p_]), "' in rule '", name,
                            "' (expected a newline or the end)"));
    }
  }

  std::vector<Seq> ParseAlternatives(const std::string& rule, bool nested) {
    std::vector<Seq> alts;
    alts.push_back(ParseSequence(rule, nested));
    while (ok_ && At('|')) {
      ++p_;
      SkipSpace(true);
      alts.push_back(ParseSequence(rule, nested));
    }
    return alts;
  }

  Seq ParseSequence(const std::string& rule, bool nested) {
    Seq seq;
    size_t last_start = 0;  // where the last term's symbols begin in seq
    bool have_last = false;
    while (ok_ && p_ < s_.size()) {
      const size_t term = p_;
      const char c = s_[p_];
      if (c == '"') {
        ++p_;
        last_start = seq.size();
        while (ok_ && !At('"')) {
          if (p_ >= s_.size()) {
            Fail(term, "unterminated string literal");
            break;
          }
          const uint32_t cp = ParseChar("string literal");
          if (ok_) seq.push_back({Element::kClass, AddClass({{{cp, cp}}, false})});
        }
        if (!ok_) break;
        ++p_;
        have_last = true;
      } else if (c == '[') {
        ++p_;
        CharClass cls;
        if (At('^')) {
          cls.negated = true;
          ++p_;
        }
        while (ok_ && !At(']')) {
          if (p_ >= s_.size()) {
            Fail(term, "unterminated character class");
            break;
          }
          const uint32_t lo = ParseChar("character class");
          uint32_t hi = lo;
          if (ok_ && At('-') && p_ + 1 < s_.size() && s_[p_ + 1] != ']') {
            ++p_;
            const size_t hi_pos = p_;
            hi = ParseChar("character class");
            if (ok_ && hi < lo) {
              Fail(hi_pos, absl::StrFormat(
                               "character class range ends below its start (U+%04X to U+%04X)",
                               lo, hi));
            }
          }
          cls.ranges.push_back({lo, hi});
        }
        if (!ok_) break;
        ++p_;
        last_start = seq.size();
        seq.push_back({Element::kClass, AddClass(std::move(cls))});
        have_last = true;
      } else if (c == '.') {
        ++p_;
        last_start = seq.size();
        seq.push_back({Element::kClass, AddClass({{}, true})});
        have_last = true;
      } else if (IsNameChar(c)) {
        const std::string name = ParseName();
        last_start = seq.size();
        seq.push_back({Element::kRuleRef, RuleId(name, term)});
        have_last = true;
      } else if (c == '(') {
        if (++nesting_ > kMaxNesting) {
          Fail(term, absl::StrCat("groups nest deeper than ", kMaxNesting, " levels"));
          break;
        }
        ++p_;
        SkipSpace(true);
        const uint32_t id = NewHelper(rule, term);
        std::vector<Seq> alts = ParseAlternatives(rule, true);
        if (!ok_) break;
        if (!At(')')) {
          Fail(p_, p_ < s_.size() ? absl::StrCat("expected ) to close the group opened at ",
                                                 "this rule's '(', got '",
                                                 std::string(1, s_[p_]), "'")
                                  : std::string("unterminated group: expected )"));
          break;
        }
        ++p_;
        --nesting_;
        rules_[id].alts = std::move(alts);
        last_start = seq.size();
        seq.push_back({Element::kRuleRef, id});
        have_last = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) {
          Fail(term, absl::StrCat("'", std::string(1, c), "' repeats nothing (no item before it)"));
          break;
        }
        int lo = 0, hi = -1;  // hi -1: unbounded
        ++p_;
        if (c == '+') {
          lo = 1;
        } else if (c == '?') {
          hi = 1;
        } else if (c == '{') {
          SkipSpace(false);
          lo = ParseCount();
          SkipSpace(false);
          if (!ok_) break;
          if (At(',')) {
            ++p_;
            SkipSpace(false);
            if (!At('}')) {
              hi = ParseCount();
              SkipSpace(false);
            }
          } else {
            hi = lo;
          }
          if (!ok_) break;
          if (!At('}')) {
            Fail(p_, "expected } to close the repetition {m,n}");
            break;
          }
          ++p_;
          if (hi >= 0 && hi < lo) {
            Fail(term, absl::StrCat("repetition {", lo, ",", hi, "} has max < min"));
            break;
          }
        }
        Repeat(rule, term, last_start, lo, hi, &seq);
        have_last = false;  // x** is refused, as llama.cpp does
      } else {
        break;  // | ) newline end: the sequence is over
      }
      if (!ok_) break;
      SkipSpace(nested);
      if (seq.size() > kMaxGrammarElements) {
        Fail(term, absl::StrCat("the grammar is too large (more than ", kMaxGrammarElements,
                                " elements)"));
      }
    }
    return seq;
  }

  int ParseCount() {
    const size_t start = p_;
    int64_t v = 0;
    while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') {
      v = v * 10 + (s_[p_++] - '0');
      if (v > kMaxRepetition) {
        Fail(start, absl::StrCat("repetition count exceeds ", kMaxRepetition));
        return 0;
      }
    }
    if (p_ == start) Fail(p_, "expected a repetition count (an integer)");
    return static_cast<int>(v);
  }

  // seq[from, end) repeated lo..hi times (hi -1: unbounded), as helper rules:
  // x{2,} -> x x R with R ::= x R | ; x{1,3} -> x O2 with O2 ::= x O1 | , O1 ::= x | .
  void Repeat(const std::string& rule, size_t pos, size_t from, int lo, int hi, Seq* seq) {
    Seq item(seq->begin() + static_cast<ptrdiff_t>(from), seq->end());
    seq->resize(from);
    if (item.empty()) return;  // "" repeated is still ""
    if (item.size() > 1) {
      const uint32_t g = NewHelper(rule, pos);
      rules_[g].alts = {item};
      item = {{Element::kRuleRef, g}};
    }
    for (int i = 0; i < lo; ++i) seq->push_back(item[0]);
    if (hi < 0) {
      const uint32_t r = NewHelper(rule, pos);
      rules_[r].alts = {{item[0], {Element::kRuleRef, r}}, {}};
      seq->push_back({Element::kRuleRef, r});
    } else if (hi > lo) {
      uint32_t prev = 0;
      for (int k = 1; k <= hi - lo; ++k) {
        const uint32_t o = NewHelper(rule, pos);
        Seq first = {item[0]};
        if (k > 1) first.push_back({Element::kRuleRef, prev});
        rules_[o].alts = {first, {}};
        prev = o;
      }
      seq->push_back({Element::kRuleRef, prev});
    }
  }

  // One character of a literal or class, escapes decoded.
  uint32_t ParseChar(const char* where) {
    const size_t start = p_;
    if (s_[p_] == '\\') {
      if (p_ + 1 >= s_.size()) {
        Fail(start, absl::StrCat("unterminated escape in a ", where));
        return 0;
      }
      const char e = s_[p_ + 1];
      p_ += 2;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': return e;
        case 'x': return ParseHex(start, 2);
        case 'u': return ParseHex(start, 4);
        case 'U': return ParseHex(start, 8);
        default:
          Fail(start, absl::StrCat("unknown escape \\", std::string(1, e), " in a ", where));
          return 0;
      }
    }
    const std::string_view rest = s_.substr(p_);
    const size_t n = utf8::SymbolLength(rest);
    if (n == 1 && static_cast<unsigned char>(rest[0]) >= 0x80) {
      Fail(start, absl::StrCat("invalid UTF-8 in a ", where));
      return 0;
    }
    p_ += n;
    return utf8::Decode(rest);
  }

  uint32_t ParseHex(size_t start, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (p_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[p_]))) {
        Fail(start, absl::StrCat("escape needs ", digits, " hex digits"));
        return 0;
      }
      const char c = s_[p_++];
      v = v * 16 + static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    if (v > 0x10FFFF) {
      Fail(start, absl::StrFormat("escape names U+%04X, past U+10FFFF", v));
      return 0;
    }
    return v;
  }

  uint32_t AddClass(CharClass cls) {
    // Sorted and merged, so that matching can binary-search.
    std::sort(cls.ranges.begin(), cls.ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : cls.ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    cls.ranges = std::move(merged);
    classes_.push_back(std::move(cls));
    return static_cast<uint32_t>(classes_.size() - 1);
  }

  absl::Status CheckLeftRecursion() {
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& alt : rules_[r].alts) {
          if (std::all_of(alt.begin(), alt.end(), [&](const Sym& s) {
                return s.kind == Element::kRuleRef && nullable[s.value];
              })) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Edges A -> B where B can start A without a character before it.
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (const Seq& alt : rules_[r].alts) {
        for (const Sym& s : alt) {
          if (s.kind != Element::kRuleRef) break;
          left[r].push_back(s.value);
          if (!nullable[s.value]) break;
        }
      }
    }
    // Depth-first, with an explicit stack (a grammar may have thousands of rules).
    std::vector<uint8_t> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;  // rule, next edge to follow
    for (uint32_t start = 0; start < n; ++start) {
      if (state[start] != 0) continue;
      path.push_back({start, 0});
      state[start] = 1;
      while (!path.empty()) {
        auto& [r, edge] = path.back();
        if (edge == left[r].size()) {
          state[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t next = left[r][edge++];
        if (state[next] == 0) {
          state[next] = 1;
          path.push_back({next, 0});
        } else if (state[next] == 1) {
          std::string cycle;
          auto it = std::find_if(path.begin(), path.end(),
                                 [&](const auto& e) { return e.first == next; });
          for (; it != path.end(); ++it) absl::StrAppend(&cycle, names_[it->first], " -> ");
          absl::StrAppend(&cycle, names_[next]);
          Fail(rules_[next].pos,
               absl::StrCat("rule '", names_[next], "' is left-recursive (", cycle,
                            " without matching a character); rewrite it with repetition"));
          return Error();
        }
      }
    }
    return absl::OkStatus();
  }

  Grammar Flatten(uint32_t root) {
    Grammar g;
    g.root = root;
    g.rule_names = names_;
    g.classes = std::move(classes_);
    for (const RawRule& r : rules_) {
      g.rule_start.push_back(static_cast<uint32_t>(g.elements.size()));
      for (size_t a = 0; a < r.alts.size(); ++a) {
        for (const Sym& s : r.alts[a]) g.elements.push_back({s.kind, s.value});
        g.elements.push_back({a + 1 < r.alts.size() ? Element::kAlt : Element::kEnd, 0});
      }
    }
    return g;
  }

  std::string_view s_;
  size_t p_ = 0;
  bool ok_ = true;
  size_t err_pos_ = 0;
  std::string err_;
  std::vector<RawRule> rules_;
  std::vector<std::string> names_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
  std::vector<CharClass> classes_;
  int helper_count_ = 0;
  int nesting_ = 0;
};

}  // namespace

absl::StatusOr<Grammar> ParseGbnf(std::string_view text) { return Parser(text).Run(); }

}  // namespace thermocline::grammar
