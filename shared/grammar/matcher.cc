#include "shared/grammar/matcher.h"

#include <algorithm>

namespace thermocline::grammar {
namespace {

bool EndsAlternative(const Element& e) { return e.kind == Element::kEnd || e.kind == Element::kAlt; }

// `st` (top last) expanded through rule references until a class is on top (or it is empty),
// every result added to *out. `st` is restored before returning. Left recursion was refused by
// the parser, so the expansion terminates; `budget` bounds its work, since an ambiguous
// grammar (`("" | "")` twenty times) has exponentially many paths to the same stacks.
void Expand(const Grammar& g, std::vector<uint32_t>& st, StackSet* out, int64_t* budget) {
  if (--*budget < 0) return;
  if (st.empty() || g.elements[st.back()].kind == Element::kClass) {
    out->Add(st);
    return;
  }
  const uint32_t pos = st.back();
  const uint32_t rule = g.elements[pos].value;
  st.pop_back();
  const bool cont = !EndsAlternative(g.elements[pos + 1]);
  if (cont) st.push_back(pos + 1);
  for (uint32_t p = g.rule_start[rule];;) {
    const bool nonempty = !EndsAlternative(g.elements[p]);
    if (nonempty) st.push_back(p);
    Expand(g, st, out, budget);
    if (nonempty) st.pop_back();
    while (!EndsAlternative(g.elements[p])) ++p;
    if (g.elements[p].kind == Element::kEnd) break;
    ++p;
  }
  if (cont) st.pop_back();
  st.push_back(pos);
}

// False when the expansion ran out of budget (the result is then incomplete).
bool AcceptCodepoint(const Grammar& g, const StackSet& from, uint32_t cp, StackSet* to,
                     Scratch* scratch) {
  to->Clear();
  int64_t budget = kExpandBudget;
  std::vector<uint32_t>& st = scratch->stack;
  for (size_t i = 0; i < from.size(); ++i) {
    std::span<const uint32_t> s = from[i];
    if (s.empty()) continue;
    const uint32_t top = s.back();
    if (!g.classes[g.elements[top].value].Matches(cp)) continue;
    st.assign(s.begin(), s.end() - 1);
    if (!EndsAlternative(g.elements[top + 1])) st.push_back(top + 1);
    Expand(g, st, to, &budget);
  }
  return budget >= 0;
}

// Whether the class can match some valid code point in [lo, hi] (surrogates excluded).
bool ClassMatchesRange(const CharClass& c, uint32_t lo, uint32_t hi) {
  if (hi < 0xD800 || lo > 0xDFFF) return c.MatchesAnyIn(lo, hi);
  return (lo < 0xD800 && c.MatchesAnyIn(lo, 0xD7FF)) || (hi > 0xDFFF && c.MatchesAnyIn(0xE000, hi));
}

constexpr uint32_t kMinOfLength[] = {0, 0, 0x80, 0x800, 0x10000};

}  // namespace

void StackSet::Add(std::span<const uint32_t> stack) {
  for (size_t i = 0; i < size(); ++i) {
    std::span<const uint32_t> s = (*this)[i];
    if (s.size() == stack.size() && std::equal(s.begin(), s.end(), stack.begin())) return;
  }
  data_.insert(data_.end(), stack.begin(), stack.end());
  ends_.push_back(static_cast<uint32_t>(data_.size()));
}

MatchState InitialState(const Grammar& g) {
  MatchState s;
  // root's alternatives, as if `root` were referenced from an empty stack.
  std::vector<uint32_t> st;
  int64_t budget = kExpandBudget;
  for (uint32_t p = g.rule_start[g.root];;) {
    const bool nonempty = !EndsAlternative(g.elements[p]);
    if (nonempty) st.push_back(p);
    Expand(g, st, &s.stacks, &budget);
    if (nonempty) st.pop_back();
    while (!EndsAlternative(g.elements[p])) ++p;
    if (g.elements[p].kind == Element::kEnd) break;
    ++p;
  }
  if (budget < 0) s.stacks.Clear();  // refused by ParseGbnf; never half a state
  return s;
}

bool AdvanceByte(const Grammar& g, const MatchState& from, uint8_t b, MatchState* to,
                 Scratch* scratch) {
  uint32_t cp;
  uint8_t left, len;
  if (from.left == 0) {
    if (b < 0x80) {
      cp = b, left = 0, len = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      cp = b & 0x1F, left = 1, len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      cp = b & 0x0F, left = 2, len = 3;
    } else if (b >= 0xF0 && b <= 0xF4) {
      cp = b & 0x07, left = 3, len = 4;
    } else {
      return false;  // a continuation byte with no lead, or a byte UTF-8 never uses
    }
  } else {
    if ((b & 0xC0) != 0x80) return false;
    cp = (from.cp << 6) | (b & 0x3F);
    left = static_cast<uint8_t>(from.left - 1);
    len = from.len;
  }
  to->cp = cp;
  to->left = left;
  to->len = len;
  if (left == 0) {
    if (cp < kMinOfLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    // Out of budget: the character is refused (never a partial state: the text stays valid).
    return AcceptCodepoint(g, from.stacks, cp, &to->stacks, scratch) && !to->stacks.empty();
  }
  // Incomplete: the code points this sequence can still become.
  const uint32_t shift = 6u * left;
  const uint32_t lo = std::max(cp << shift, kMinOfLength[len]);
  const uint32_t hi = std::min((cp << shift) | ((1u << shift) - 1), 0x10FFFFu);
  to->stacks.Clear();
  if (lo > hi) return false;
  for (size_t i = 0; i < from.stacks.size(); ++i) {
    std::span<const uint32_t> s = from.stacks[i];
    if (!s.empty() && ClassMatchesRange(g.classes[g.elements[s.back()].value], lo, hi)) {
      to->stacks.Add(s);
    }
  }
  return !to->stacks.empty();
}

bool CanEnd(const MatchState& s) {
  if (s.left != 0) return false;
  for (size_t i = 0; i < s.stacks.size(); ++i) {
    if (s.stacks[i].empty()) return true;
  }
  return false;
}

bool IsComplete(const MatchState& s) {
  return s.left == 0 && s.stacks.size() == 1 && s.stacks[0].empty();
}

Matcher::Matcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), state_(InitialState(*grammar_)) {}

bool Matcher::Accept(std::string_view bytes) {
  MatchState cur = state_;
  for (char c : bytes) {
    if (!AdvanceByte(*grammar_, cur, static_cast<uint8_t>(c), &next_, &scratch_)) return false;
    std::swap(cur, next_);
  }
  state_ = std::move(cur);
  return true;
}

}  // namespace thermocline::grammar
