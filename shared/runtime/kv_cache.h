// Key/value cache for attention: per layer, per sequence slot, per position, one kv_dim vector
// of keys and one of values, stored as f32 or f16.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/gguf/ggml_type.h"
#include "shared/model/model.h"

namespace thermocline {

class KvCache {
 public:
  // `type` is kF32 or kF16. capacity is the number of positions per slot.
  static absl::StatusOr<KvCache> Create(const ModelConfig& config, int64_t n_slots,
                                        int64_t capacity, GgmlType type);

  int64_t n_slots() const { return n_slots_; }
  int64_t capacity() const { return capacity_; }
  int64_t kv_dim() const { return kv_dim_; }
  GgmlType type() const { return type_; }
  int64_t bytes() const { return static_cast<int64_t>(k_.size() + v_.size()); }

  // Number of valid positions of a slot (0 after Reset).
  int64_t length(int64_t slot) const { return length_[slot]; }
  void set_length(int64_t slot, int64_t n) { length_[slot] = n; }
  void Reset(int64_t slot) { length_[slot] = 0; }

  // Start of the key (value) vector at (layer, slot, pos); element type per type().
  uint8_t* key(int64_t layer, int64_t slot, int64_t pos) { return k_.data() + Offset(layer, slot, pos); }
  uint8_t* value(int64_t layer, int64_t slot, int64_t pos) { return v_.data() + Offset(layer, slot, pos); }
  const uint8_t* key(int64_t layer, int64_t slot, int64_t pos) const { return k_.data() + Offset(layer, slot, pos); }
  const uint8_t* value(int64_t layer, int64_t slot, int64_t pos) const { return v_.data() + Offset(layer, slot, pos); }

  // Converts and stores one position's keys and values.
  void Store(int64_t layer, int64_t slot, int64_t pos, const float* k, const float* v);

 private:
  int64_t Offset(int64_t layer, int64_t slot, int64_t pos) const {
    return ((layer * n_slots_ + slot) * capacity_ + pos) * row_bytes_;
  }

  GgmlType type_ = GgmlType::kF32;
  int64_t n_slots_ = 0, capacity_ = 0, kv_dim_ = 0, row_bytes_ = 0;
  std::vector<uint8_t> k_, v_;
  std::vector<int64_t> length_;
};

}  // namespace thermocline
