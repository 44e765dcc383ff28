#include "shared/runtime/kv_cache.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "shared/util/fp16.h"

namespace thermocline {

absl::StatusOr<KvCache> KvCache::Create(const ModelConfig& config, int64_t n_slots,
                                        int64_t capacity, GgmlType type) {
  if (type != GgmlType::kF32 && type != GgmlType::kF16) {
    return absl::InvalidArgumentError("KV cache type must be f32 or f16");
  }
  if (n_slots <= 0 || capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache needs at least one slot and one position (got ", n_slots,
                     " slots, ", capacity, " positions)"));
  }
  if (capacity > config.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache capacity ", capacity,
                                                   " exceeds the model's context length ",
                                                   config.context_length));
  }
  KvCache c;
  c.type_ = type;
  c.n_slots_ = n_slots;
  c.capacity_ = capacity;
  c.kv_dim_ = config.kv_dim;
  c.row_bytes_ = config.kv_dim * (type == GgmlType::kF32 ? 4 : 2);
  const int64_t total = config.n_layers * n_slots * capacity * c.row_bytes_;
  c.k_.resize(total);
  c.v_.resize(total);
  c.length_.assign(n_slots, 0);
  return c;
}

void KvCache::Store(int64_t layer, int64_t slot, int64_t pos, const float* k, const float* v) {
  uint8_t* kd = key(layer, slot, pos);
  uint8_t* vd = value(layer, slot, pos);
  if (type_ == GgmlType::kF32) {
    std::memcpy(kd, k, kv_dim_ * sizeof(float));
    std::memcpy(vd, v, kv_dim_ * sizeof(float));
    return;
  }
  auto* kh = reinterpret_cast<uint16_t*>(kd);
  auto* vh = reinterpret_cast<uint16_t*>(vd);
  for (int64_t i = 0; i < kv_dim_; ++i) {
    kh[i] = Fp32ToFp16(k[i]);
    vh[i] = Fp32ToFp16(v[i]);
  }
}

}  // namespace thermocline
