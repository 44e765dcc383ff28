// The prefix cache's bookkeeping over a paged KV cache (kv_cache.h): which block each slot's
// positions live in, which full blocks hold which token prefix, and which blocks are free.
// It holds no keys or values: the caller applies its tables and copies to a KvCache, in this
// process (ForwardPassRunner) or in the gpu_worker (the split engine sends them with each step).
//
// - Blocks are refcounted; a full block (kKvBlockSize positions) is registered under a hash
//   chain key, H(parent block's key, its tokens), with its parent and tokens kept so a lookup
//   compares them (a hash match alone is never trusted).
// - A registered block stays after the last sequence holding it ends: unreferenced, it sits in
//   an LRU list and is taken (evicted) only when the pool has no free block left.
// - A block is written only while it is private: shared and registered blocks are read-only;
//   writing into one (a rewind, or a fork's partial last block) first gives the slot a private
//   copy (a KvBlockCopy the caller performs before the step's entries run).
// - With the cache off (extra_blocks < 0, see Create) nothing is shared or kept and slot s uses
//   exactly its identity blocks: the contiguous cache, as backends without paging need.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_cache.h"

namespace thermocline {

struct PrefixCacheStats {
  int64_t hit_tokens = 0;      // prompt positions found cached or forked (not computed)
  int64_t query_tokens = 0;    // prompt positions looked up or forked (hits + misses)
  int64_t evictions = 0;       // cached blocks taken for other use
  int64_t cached_blocks = 0;   // blocks registered now (referenced or not)
};

// What the caller applies before a step's entries run: copies first, then each touched slot's
// table (every slot the step writes).
struct KvPlan {
  std::vector<KvBlockCopy> copies;
  std::vector<KvSlotTable> tables;
};

class KvBlockManager {
 public:
  // n_slots x capacity positions, plus `extra_blocks` blocks only the cache uses; the pool
  // has KvCache::Create's size for the same numbers. enabled = false: the cache is off.
  KvBlockManager(int32_t n_slots, int32_t capacity, int32_t extra_blocks, bool enabled);

  bool enabled() const { return enabled_; }
  int32_t n_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t blocks_per_slot() const { return blocks_per_slot_; }

  // Maps the longest cached prefix of `tokens` (whole blocks, leaving at least the last token
  // to compute, since its logits are wanted) into `slot`, which must be empty; returns the
  // positions it now holds. Counts the lookup into stats(). 0 with the cache off.
  int32_t AttachPrefix(int32_t slot, std::span<const int32_t> tokens);
  // `dst` (empty) holds the first n positions of `src`: full blocks shared, a partial last block
  // copied (the copy is in the next Prepare's plan, before anything writes either block).
  // FailedPrecondition with the cache off or when n exceeds src's length.
  absl::Status Fork(int32_t src, int32_t dst, int32_t n);

  // Gives every position the entries write a private block (allocating, evicting, copying on
  // write) and returns what to apply. Entries must pass ForwardPass's position rules against
  // length(); an error (a position past the slot's length, the pool exhausted) changes nothing
  // the caller has to undo.
  absl::StatusOr<KvPlan> Prepare(std::span<const BatchEntry> entries);
  // Records a step that ran: the slots' tokens and lengths, and registers blocks now full.
  void Commit(std::span<const BatchEntry> entries);
  // The slot's sequence is over: its blocks are released (registered ones stay cached).
  void Release(int32_t slot);
  // The KV data of every block is gone (a restarted gpu_worker): unreferenced cached blocks
  // are dropped; referenced ones stay registered, since the replay recomputes them.
  void DropUnreferenced();

  int32_t length(int32_t slot) const { return static_cast<int32_t>(slots_[slot].tokens.size()); }
  const std::vector<int32_t>& tokens(int32_t slot) const { return slots_[slot].tokens; }
  // The slot's table as KvCache::Apply takes it, with `length` valid positions.
  KvSlotTable Table(int32_t slot, int32_t length) const;
  int32_t refs(int32_t block) const { return blocks_[block].refs; }
  bool cached(int32_t block) const { return blocks_[block].cached; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Block {
    int32_t refs = 0;
    bool cached = false;
    uint64_t key = 0;
    uint64_t generation = 0;  // bumped whenever the block stops holding what it was registered for
    int32_t parent = -1;      // registered: the block before it (-1: first of a sequence)
    uint64_t parent_generation = 0;
    std::array<int32_t, kKvBlockSize> tokens{};
    std::list<int32_t>::iterator lru;  // valid while cached and unreferenced
  };
  struct Slot {
    std::vector<int32_t> table;
    std::vector<int32_t> tokens;  // committed positions
  };

  static uint64_t ChainKey(uint64_t parent_key, std::span<const int32_t> tokens);
  // Whether the registered `block` holds `tokens` right after `parent` (-1: at the start).
  bool Continues(int32_t block, int32_t parent, std::span<const int32_t> tokens) const;
  // The registered block for `tokens` after `parent` (-1: none), or -1.
  int32_t Lookup(int32_t parent, uint64_t key, std::span<const int32_t> tokens) const;
  absl::StatusOr<int32_t> Allocate(int32_t slot, int32_t index);
  void Ref(int32_t block);
  void Unref(int32_t block);
  void Unregister(int32_t block);

  const bool enabled_;
  const int32_t capacity_;
  const int32_t blocks_per_slot_;
  std::vector<Block> blocks_;
  std::vector<Slot> slots_;
  std::vector<int32_t> free_;   // unreferenced, unregistered
  std::list<int32_t> lru_;      // unreferenced, registered; front = least recently used
  absl::flat_hash_map<uint64_t, int32_t> index_;
  std::vector<KvBlockCopy> pending_copies_;
  PrefixCacheStats stats_;
};

}  // namespace thermocline
