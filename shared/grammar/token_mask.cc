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

int32_t MaskComputer::Compute(const Grammar& g, const MatchState& state, const VocabTrie& trie,
                              std::vector<uint8_t>* allowed, std::span<const int32_t> end_tokens) {
  allowed->assign(static_cast<size_t>(trie.vocab_size()), 0);
  const auto& nodes = trie.nodes_;
  if (states_.empty()) states_.resize(1);
  states_[0] = state;
  int32_t count = 0;
  for (uint32_t i = 1; i < nodes.size();) {
    const VocabTrie::Node& n = nodes[i];
    if (states_.size() <= n.depth) states_.resize(n.depth + 1u);
    if (!AdvanceByte(g, states_[n.depth - 1], n.byte, &states_[n.depth], &scratch_)) {
      i = n.end;  // no token below this prefix can match
      continue;
    }
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
