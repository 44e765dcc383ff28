#include "shared/runtime/kv_blocks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace thermocline {
namespace {

// splitmix64's finalizer: every input bit reaches every output bit.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

KvBlockManager::KvBlockManager(int32_t n_slots, int32_t capacity, int32_t extra_blocks,
                               bool enabled)
    : enabled_(enabled),
      capacity_(capacity),
      blocks_per_slot_(static_cast<int32_t>(KvCache::BlocksFor(capacity))),
      slots_(std::max(0, n_slots)) {
  const int64_t n = int64_t{std::max(0, n_slots)} * blocks_per_slot_ + std::max(0, extra_blocks);
  blocks_.resize(static_cast<size_t>(n));
  // Lowest ids taken first (a stack: pushed highest first).
  for (int64_t b = n - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

uint64_t KvBlockManager::ChainKey(uint64_t parent_key, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent_key ^ 0x70726566697821ull);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

bool KvBlockManager::Continues(int32_t block, int32_t parent,
                               std::span<const int32_t> tokens) const {
  // The key only says where to look: the block must continue this very parent (still holding
  // what it held when the child was registered) with these very tokens.
  const Block& b = blocks_[block];
  if (!b.cached || b.parent != parent) return false;
  if (parent >= 0 && b.parent_generation != blocks_[parent].generation) return false;
  return std::equal(tokens.begin(), tokens.end(), b.tokens.begin());
}

int32_t KvBlockManager::Lookup(int32_t parent, uint64_t key,
                               std::span<const int32_t> tokens) const {
  auto it = index_.find(key);
  if (it == index_.end() || !Continues(it->second, parent, tokens)) return -1;
  return it->second;
}

void KvBlockManager::Ref(int32_t block) {
  Block& b = blocks_[block];
  if (b.refs == 0 && b.cached) lru_.erase(b.lru);
  ++b.refs;
}

void KvBlockManager::Unref(int32_t block) {
  Block& b = blocks_[block];
  if (--b.refs > 0) return;
  if (b.cached) {
    b.lru = lru_.insert(lru_.end(), block);
  } else if (enabled_) {
    free_.push_back(block);
  }
}

void KvBlockManager::Unregister(int32_t block) {
  Block& b = blocks_[block];
  if (!b.cached) return;
  auto it = index_.find(b.key);
  if (it != index_.end() && it->second == block) index_.erase(it);
  if (b.refs == 0) lru_.erase(b.lru);
  b.cached = false;
  ++b.generation;  // children registered under it no longer match
  --stats_.cached_blocks;
}

absl::StatusOr<int32_t> KvBlockManager::Allocate(int32_t slot, int32_t index) {
  int32_t b = -1;
  if (!enabled_) {
    // Off: the identity layout, so a backend without block tables computes the same thing.
    b = slot * blocks_per_slot_ + index;
    if (blocks_[b].refs != 0) {
      return absl::InternalError(absl::StrCat("KV block ", b, " of slot ", slot, " is in use"));
    }
  } else if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    Unregister(b);  // also takes it off the LRU list
    ++stats_.evictions;
  } else {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache: all ", blocks_.size(), " blocks are held by running sequences"));
  }
  blocks_[b].refs = 1;
  return b;
}

int32_t KvBlockManager::AttachPrefix(int32_t slot, std::span<const int32_t> tokens) {
  Slot& s = slots_[slot];
  if (!enabled_ || !s.table.empty() || tokens.empty()) return 0;
  stats_.query_tokens += static_cast<int64_t>(tokens.size());
  // The last token is always computed: its logits are the first sampled token's.
  const size_t n_full = (tokens.size() - 1) / kKvBlockSize;
  uint64_t key = 0;
  int32_t parent = -1;
  for (size_t i = 0; i < n_full; ++i) {
    const auto block = tokens.subspan(i * kKvBlockSize, kKvBlockSize);
    key = ChainKey(key, block);
    const int32_t b = Lookup(parent, key, block);
    if (b < 0) break;
    Ref(b);
    s.table.push_back(b);
    parent = b;
  }
  const int32_t matched = static_cast<int32_t>(s.table.size() * kKvBlockSize);
  s.tokens.assign(tokens.begin(), tokens.begin() + matched);
  stats_.hit_tokens += matched;
  return matched;
}

absl::Status KvBlockManager::Fork(int32_t src, int32_t dst, int32_t n) {
  if (!enabled_) return absl::FailedPreconditionError("KV fork: the prefix cache is off");
  Slot& from = slots_[src];
  Slot& to = slots_[dst];
  if (src == dst || !to.table.empty() || n < 0 || n > static_cast<int32_t>(from.tokens.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV fork of ", n, " positions from slot ", src, " (", from.tokens.size(),
        " positions) into slot ", dst, " (", to.tokens.size(), " positions)"));
  }
  const int32_t n_full = n / static_cast<int32_t>(kKvBlockSize);
  for (int32_t i = 0; i < n_full; ++i) {
    Ref(from.table[i]);
    to.table.push_back(from.table[i]);
  }
  if (n % kKvBlockSize != 0) {
    auto b = Allocate(dst, n_full);
    if (!b.ok()) {
      Release(dst);
      return b.status();
    }
    // The source stays referenced until the copy is planned, so nothing reuses it first.
    Ref(from.table[n_full]);
    pending_copies_.push_back({from.table[n_full], *b});
    to.table.push_back(*b);
  }
  to.tokens.assign(from.tokens.begin(), from.tokens.begin() + n);
  // Positions the fork did not compute count as found in the cache.
  stats_.query_tokens += n;
  stats_.hit_tokens += n;
  return absl::OkStatus();
}

absl::StatusOr<KvPlan> KvBlockManager::Prepare(std::span<const BatchEntry> entries) {
  KvPlan plan;
  // A fork's copy source is held for its copy until the end of this Prepare (nothing here may
  // reuse it), and that hold does not make it shared: its slot may still write it, after the
  // copy.
  absl::flat_hash_map<int32_t, int32_t> held;
  for (const KvBlockCopy& c : pending_copies_) ++held[c.src];
  auto shared = [&](int32_t b) {
    auto it = held.find(b);
    return blocks_[b].refs - (it == held.end() ? 0 : it->second) > 1;
  };
  // Running length and first position of each slot the step writes.
  absl::flat_hash_map<int32_t, int32_t> length;
  std::vector<std::pair<int32_t, int32_t>> touched;  // slot, first position
  for (size_t i = 0; i < entries.size(); ++i) {
    const BatchEntry& e = entries[i];
    if (e.slot < 0 || e.slot >= static_cast<int32_t>(slots_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", i, ": slot ", e.slot,
                                                     " is not in [0, ", slots_.size(), ")"));
    }
    Slot& s = slots_[e.slot];
    auto [it, first] = length.try_emplace(e.slot, static_cast<int32_t>(s.tokens.size()));
    const int32_t p = e.position;
    if (p < 0 || p > it->second || p >= capacity_) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", i, ": position ", p, " of slot ",
                                                     e.slot, " (which holds ", it->second,
                                                     " positions, at most ", capacity_, ")"));
    }
    if (first) touched.push_back({e.slot, p});
    const size_t bi = static_cast<size_t>(p / kKvBlockSize);
    if (p < it->second) {
      // A rewind: the blocks after the one written hold nothing the slot keeps.
      while (s.table.size() > bi + 1) {
        Unref(s.table.back());
        s.table.pop_back();
      }
    }
    if (bi == s.table.size()) {
      auto b = Allocate(e.slot, static_cast<int32_t>(bi));
      if (!b.ok()) return b.status();
      s.table.push_back(*b);
    } else if (const int32_t old = s.table[bi]; shared(old) || blocks_[old].cached) {
      // Copy-on-write: the block is shared or registered, so this slot gets its own copy.
      auto b = Allocate(e.slot, static_cast<int32_t>(bi));
      if (!b.ok()) return b.status();
      if (p % kKvBlockSize != 0) plan.copies.push_back({old, *b});
      s.table[bi] = *b;
      Unref(old);
    }
    it->second = p + 1;
  }
  plan.copies.insert(plan.copies.begin(), pending_copies_.begin(), pending_copies_.end());
  for (const KvBlockCopy& c : pending_copies_) Unref(c.src);
  pending_copies_.clear();
  for (const auto& [slot, first_position] : touched) {
    const int32_t held = std::min(static_cast<int32_t>(slots_[slot].tokens.size()), first_position);
    plan.tables.push_back(Table(slot, held));
  }
  return plan;
}

void KvBlockManager::Commit(std::span<const BatchEntry> entries) {
  std::vector<int32_t> touched;
  for (const BatchEntry& e : entries) {
    std::vector<int32_t>& tokens = slots_[e.slot].tokens;
    if (std::find(touched.begin(), touched.end(), e.slot) == touched.end()) {
      touched.push_back(e.slot);
    }
    tokens.resize(e.position);  // a rewind drops what followed
    tokens.push_back(e.token);
  }
  if (!enabled_) return;
  for (int32_t slot : touched) {
    Slot& s = slots_[slot];
    uint64_t key = 0;
    int32_t parent = -1;
    const size_t n_full = std::min(s.tokens.size() / kKvBlockSize, s.table.size());
    for (size_t i = 0; i < n_full; ++i) {
      const int32_t b = s.table[i];
      Block& block = blocks_[b];
      if (block.cached) {
        key = block.key;
        parent = b;
        continue;
      }
      const auto tokens = std::span<const int32_t>(s.tokens).subspan(i * kKvBlockSize,
                                                                     kKvBlockSize);
      key = ChainKey(key, tokens);
      if (auto it = index_.find(key); it != index_.end()) {
        // Another block holds this prefix, or held it under a parent since evicted (or, rarely,
        // holds another one with the same key). A live one wins: this block stays private, and
        // so do the ones after it. A stale one no sequence holds gives its key to this block.
        const int32_t other = it->second;
        if (Continues(other, parent, tokens) || blocks_[other].refs > 0) break;
        Unregister(other);
        free_.push_back(other);
      }
      block.cached = true;
      block.key = key;
      block.parent = parent;
      block.parent_generation = parent >= 0 ? blocks_[parent].generation : 0;
      std::copy(tokens.begin(), tokens.end(), block.tokens.begin());
      index_[key] = b;
      ++stats_.cached_blocks;
      parent = b;
    }
  }
}

void KvBlockManager::Release(int32_t slot) {
  Slot& s = slots_[slot];
  // Last block first: a sequence's tail is older in the LRU order than its head, so an
  // eviction takes leaves before the prefixes other requests share.
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) Unref(*it);
  s.table.clear();
  s.tokens.clear();
}

void KvBlockManager::DropUnreferenced() {
  const std::vector<int32_t> unreferenced(lru_.begin(), lru_.end());
  for (int32_t b : unreferenced) {
    Unregister(b);
    free_.push_back(b);
  }
}

KvSlotTable KvBlockManager::Table(int32_t slot, int32_t length) const {
  return KvSlotTable{slot, length, slots_[slot].table};
}

}  // namespace thermocline
