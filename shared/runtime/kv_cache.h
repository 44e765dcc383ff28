// Key/value cache for attention, paged: a pool of fixed-size blocks (kKvBlockSize positions,
// every layer's kv_dim keys and values each, f32 or f16) and per sequence slot a block table
// mapping its positions to blocks. Attention reads position by position through key()/value(),
// so where a block lives never changes the arithmetic.
//
// By default slot s owns blocks [s * blocks_per_slot, (s + 1) * blocks_per_slot) in order (the
// identity tables), which is the contiguous cache every single-sequence caller uses. A block
// manager (kv_blocks.h) remaps tables so that sequences share read-only prefix blocks, and asks
// for a block to be copied (copy-on-write) before a private copy of it is written.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/gguf/ggml_type.h"
#include "shared/model/model.h"
#include "shared/util/page_arena.h"

namespace thermocline {

// Positions per KV block: vLLM's default; small enough that a prefix shares all but at most 15
// of its positions, large enough that a table stays short.
inline constexpr int64_t kKvBlockSize = 16;

// A slot's table as a block manager sets it: `length` valid positions, held in blocks[0..],
// block i holding positions [i * kKvBlockSize, (i + 1) * kKvBlockSize).
struct KvSlotTable {
  int32_t slot = 0;
  int32_t length = 0;
  std::vector<int32_t> blocks;
};

// Copies every layer's keys and values of block src into block dst.
struct KvBlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

class KvCache {
 public:
  // `type` is kF32 or kF16. capacity is the number of positions per slot. The pool holds every
  // slot's capacity plus `extra_blocks` (room for cached prefixes no sequence holds).
  static absl::StatusOr<KvCache> Create(const ModelConfig& config, int64_t n_slots,
                                        int64_t capacity, GgmlType type,
                                        int64_t extra_blocks = 0);

  int64_t n_slots() const { return n_slots_; }
  int64_t capacity() const { return capacity_; }
  int64_t kv_dim() const { return kv_dim_; }
  GgmlType type() const { return type_; }
  int64_t bytes() const { return static_cast<int64_t>(k_.size() + v_.size()); }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t blocks_per_slot() const { return blocks_per_slot_; }
  static int64_t BlocksFor(int64_t positions) {
    return (positions + kKvBlockSize - 1) / kKvBlockSize;
  }

  // Number of valid positions of a slot (0 after Reset).
  int64_t length(int64_t slot) const { return length_[slot]; }
  void set_length(int64_t slot, int64_t n) { length_[slot] = n; }
  // Empties the slot and gives it back its identity table.
  void Reset(int64_t slot);

  // Copies first, then tables, each checked before anything changes: block ids in the pool,
  // a slot in range and at most once, a table no longer than blocks_per_slot, a length its
  // blocks cover, no copy onto itself. A bad id is an InvalidArgument naming it.
  absl::Status Apply(std::span<const KvSlotTable> tables, std::span<const KvBlockCopy> copies);
  // The same checks without changing anything (for a worker that checks before it computes).
  absl::Status Check(std::span<const KvSlotTable> tables,
                     std::span<const KvBlockCopy> copies) const;
  // Positions the slot's table maps (a position beyond them has no block: ForwardPass refuses it).
  int64_t mapped(int64_t slot) const { return mapped_[slot] * kKvBlockSize; }
  // The block that holds (slot, pos).
  int32_t block(int64_t slot, int64_t pos) const {
    return table_[slot * blocks_per_slot_ + pos / kKvBlockSize];
  }

  // Start of the key (value) vector at (layer, slot, pos); element type per type().
  uint8_t* key(int64_t layer, int64_t slot, int64_t pos) { return k_.data() + Offset(layer, slot, pos); }
  uint8_t* value(int64_t layer, int64_t slot, int64_t pos) { return v_.data() + Offset(layer, slot, pos); }
  const uint8_t* key(int64_t layer, int64_t slot, int64_t pos) const { return k_.data() + Offset(layer, slot, pos); }
  const uint8_t* value(int64_t layer, int64_t slot, int64_t pos) const { return v_.data() + Offset(layer, slot, pos); }

  // Converts and stores one position's keys and values.
  void Store(int64_t layer, int64_t slot, int64_t pos, const float* k, const float* v);

 private:
  int64_t Offset(int64_t layer, int64_t slot, int64_t pos) const {
    return ((layer * n_blocks_ + block(slot, pos)) * kKvBlockSize + pos % kKvBlockSize) *
           row_bytes_;
  }

  GgmlType type_ = GgmlType::kF32;
  int64_t n_slots_ = 0, capacity_ = 0, kv_dim_ = 0, row_bytes_ = 0, n_layers_ = 0;
  int64_t n_blocks_ = 0, blocks_per_slot_ = 0;
  // Huge pages (util/page_arena.h): attention reads every position's row each step, an f32 row
  // of a 2048-wide model being two 4 KiB pages. Pages are committed as positions first write
  // them, not all at creation.
  PageBuffer k_, v_;
  std::vector<int64_t> length_;
  std::vector<int32_t> table_;  // [slot][blocks_per_slot]
  std::vector<int64_t> mapped_;  // table entries in use, per slot
};

}  // namespace thermocline
