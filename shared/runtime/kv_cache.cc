#include "shared/runtime/kv_cache.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  // Sized in 128 bits and checked against the machine's memory before anything is allocated: a
  // context_length from a file (up to 2^31) times slots must give a clear refusal, not an
  // overflow or std::bad_alloc.
  const unsigned __int128 per_side = static_cast<unsigned __int128>(config.n_layers) * n_slots *
                                     capacity * c.row_bytes_;
  const unsigned __int128 both = 2 * per_side;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const unsigned __int128 memory =
      pages > 0 && page > 0 ? static_cast<unsigned __int128>(pages) * page : both;
  if (both > memory) {
    const double gib = static_cast<double>(both) / (1024.0 * 1024 * 1024);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache needs %.1f GiB for %d slots x %d positions (%d layers, %d-wide keys and values, "
        "%s) but the machine has %.1f GiB; a smaller --context (or fewer KV slots) caps it",
        gib, n_slots, capacity, config.n_layers, config.kv_dim,
        type == GgmlType::kF32 ? "f32" : "f16", static_cast<double>(memory) / (1024.0 * 1024 * 1024)));
  }
  const int64_t total = static_cast<int64_t>(per_side);
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
