#include "shared/grammar/token_mask.h"

#include <algorithm>
#include <numeric>

namespace thermocline::grammar {

VocabTrie::VocabTrie(const Tokenizer& tokenizer) : vocab_size_(tokenizer.vocab_size()) {
  bytes_.resize(vocab_size_);
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    bytes_[id] = tokenizer.TokenBytes(-1, id);
    if (!bytes_[id].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  // Sorted strings give the preorder directly: each string shares its longest common prefix
  // with the previous one; the path below that prefix is new.
  nodes_.push_back({0, 0, 0, 0, 0});
  std::vector<uint32_t> path = {0};  // node index per depth of the current string
  std::string prev;
  for (int32_t id : order) {
    const std::string& s = bytes_[id];
    size_t common = 0;
    while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
    for (size_t d = path.size() - 1; d > common; --d) {
      nodes_[path[d]].end = static_cast<uint32_t>(nodes_.size());
    }
    path.resize(common + 1);
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back({0, 0, 0, static_cast<uint16_t>(std::min<size_t>(d + 1, 65535)),
                        static_cast<uint8_t>(s[d])});
    }
    Node& leaf = nodes_[path.back()];
    if (leaf.tokens_begin == leaf.tokens_end) {
      leaf.tokens_begin = static_cast<uint32_t>(tokens_.size());
      leaf.tokens_end = leaf.tokens_begin;
    }
    tokens_.push_back(id);  // equal strings are adjacent, so a node's tokens are contiguous
    ++leaf.tokens_end;
    prev = s;
  }
  for (uint32_t n : path) nodes_[n].end = static_cast<uint32_t>(nodes_.size());
}

namespace {
// Bounds of a MaskComputer's cache; past them it starts over (a grammar whose states keep
// changing, such as nested structures, gains little from it anyway).
constexpr size_t kMaxStates = 1 << 12;
constexpr size_t kMaxTransitions = 1 << 19;
}  // namespace

uint32_t MaskComputer::Intern(const MatchState& s) {
  key_.clear();
  auto put = [&](uint32_t v) { key_.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(s.cp);
  put(static_cast<uint32_t>(s.left) << 8 | s.len);
  for (size_t i = 0; i < s.stacks.size(); ++i) {
    std::span<const uint32_t> st = s.stacks[i];
    put(static_cast<uint32_t>(st.size()));
    for (uint32_t e : st) put(e);
  }
  auto [it, inserted] = ids_.try_emplace(key_, static_cast<uint32_t>(pool_.size()));
  if (inserted) pool_.push_back(s);
  return it->second;
}

uint32_t MaskComputer::Next(uint32_t from, uint8_t byte) {
  const uint64_t key = static_cast<uint64_t>(from) << 8 | byte;
  if (auto it = next_.find(key); it != next_.end()) return it->second;
  const uint32_t to = AdvanceByte(*grammar_, pool_[from], byte, &next_state_, &scratch_)
                          ? Intern(next_state_)
                          : kDead;
  next_.emplace(key, to);
  return to;
}

int32_t MaskComputer::Compute(const MatchState& state, const VocabTrie& trie,
                              std::vector<uint8_t>* allowed, std::span<const int32_t> end_tokens) {
  if (pool_.size() > kMaxStates || next_.size() > kMaxTransitions) {
    pool_.clear();
    ids_.clear();
    next_.clear();
  }
  allowed->assign(static_cast<size_t>(trie.vocab_size()), 0);
  const auto& nodes = trie.nodes_;
  path_.assign(1, Intern(state));
  int32_t count = 0;
  for (uint32_t i = 1; i < nodes.size();) {
    const VocabTrie::Node& n = nodes[i];
    if (path_.size() <= n.depth) path_.resize(n.depth + 1u);
    const uint32_t to = Next(path_[n.depth - 1], n.byte);
    if (to == kDead) {
      i = n.end;  // no token below this prefix can match
      continue;
    }
    path_[n.depth] = to;
    for (uint32_t t = n.tokens_begin; t < n.tokens_end; ++t) {
      (*allowed)[trie.tokens_[t]] = 1;
      ++count;
    }
    ++i;
  }
  const uint8_t can_end = CanEnd(state) ? 1 : 0;
  for (int32_t id : end_tokens) {
    if (id < 0 || id >= trie.vocab_size()) continue;
    count += can_end - (*allowed)[id];
    (*allowed)[id] = can_end;
  }
  return count;
}

}  // namespace thermocline::grammar
