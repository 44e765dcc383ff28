#include "shared/tokenizer/bpe.h"

#include <queue>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "shared/tokenizer/utf8.h"

namespace thermocline {

namespace {

// 0xFF never occurs in UTF-8, so the key cannot be ambiguous for well-formed pieces.
std::string Key(std::string_view left, std::string_view right) {
  std::string k;
  k.reserve(left.size() + right.size() + 1);
  k.append(left);
  k.push_back('\xFF');
  k.append(right);
  return k;
}

struct Symbol {
  int32_t prev;
  int32_t next;
  size_t offset;
  size_t n;  // 0 once merged into its left neighbour
};

struct Pair {
  int32_t left;
  int32_t right;
  int32_t rank;
  size_t size;  // bytes of the merged text, to detect stale entries
};

struct PairAfter {
  // The queue pops the lowest rank first, the leftmost pair among equal ranks.
  bool operator()(const Pair& a, const Pair& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

absl::StatusOr<BpeMerges> BpeMerges::FromStrings(const std::vector<std::string>& merges) {
  if (merges.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("tokenizer.ggml.merges has more than 2^31-1 entries");
  }
  BpeMerges m;
  m.ranks_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& s = merges[i];
    const size_t space = s.size() > 1 ? s.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= s.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.merges[", i, "] '",
                                                     absl::CEscape(s),
                                                     "' is not two pieces separated by a space"));
    }
    m.ranks_.try_emplace(Key(std::string_view(s).substr(0, space),
                             std::string_view(s).substr(space + 1)),
                         static_cast<int32_t>(i));
  }
  return m;
}

int32_t BpeMerges::Rank(std::string_view left, std::string_view right) const {
  auto it = ranks_.find(Key(left, right));
  return it == ranks_.end() ? -1 : it->second;
}

std::vector<std::string_view> BpeMerges::Merge(std::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t off = 0; off < word.size();) {
    const size_t len = utf8::SymbolLength(word.substr(off));
    const auto idx = static_cast<int32_t>(symbols.size());
    symbols.push_back({idx - 1, idx + 1, off, len});
    off += len;
  }
  std::vector<std::string_view> out;
  if (symbols.empty()) return out;
  symbols.back().next = -1;

  std::priority_queue<Pair, std::vector<Pair>, PairAfter> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const int32_t rank = Rank(word.substr(l.offset, l.n), word.substr(r.offset, r.n));
    if (rank >= 0) queue.push({left, right, rank, l.n + r.n});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& left = symbols[p.left];
    Symbol& right = symbols[p.right];
    // Stale entry: one side has since been merged into something else.
    if (left.n == 0 || right.n == 0 || left.next != p.right || left.n + right.n != p.size) {
      continue;
    }
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = p.left;
    try_add(left.prev, p.left);
    try_add(p.left, left.next);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    out.push_back(word.substr(symbols[i].offset, symbols[i].n));
  }
  return out;
}

}  // namespace thermocline
