#include "shared/runtime/kv_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shared/util/fp16.h"

namespace thermocline {

absl::StatusOr<KvCache> KvCache::Create(const ModelConfig& config, int64_t n_slots,
                                        int64_t capacity, GgmlType type, int64_t extra_blocks) {
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
  if (extra_blocks < 0 || extra_blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: ", extra_blocks, " extra blocks is outside [0, 2^30]"));
  }
  KvCache c;
  c.type_ = type;
  c.n_slots_ = n_slots;
  c.capacity_ = capacity;
  c.kv_dim_ = config.kv_dim;
  c.n_layers_ = config.n_layers;
  c.row_bytes_ = config.kv_dim * (type == GgmlType::kF32 ? 4 : 2);
  c.blocks_per_slot_ = BlocksFor(capacity);
  // Sized in 128 bits and checked against the machine's memory before anything is allocated: a
  // context_length from a file (up to 2^31) times slots must give a clear refusal, not an
  // overflow or std::bad_alloc.
  const unsigned __int128 blocks =
      static_cast<unsigned __int128>(n_slots) * c.blocks_per_slot_ + extra_blocks;
  const unsigned __int128 per_side =
      static_cast<unsigned __int128>(config.n_layers) * blocks * kKvBlockSize * c.row_bytes_;
  const unsigned __int128 both = 2 * per_side;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const unsigned __int128 memory =
      pages > 0 && page > 0 ? static_cast<unsigned __int128>(pages) * page : both;
  if (both > memory || blocks > INT32_MAX) {
    const double gib = static_cast<double>(both) / (1024.0 * 1024 * 1024);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache needs %.1f GiB for %d slots x %d positions and %d extra blocks (%d layers, "
        "%d-wide keys and values, %s) but the machine has %.1f GiB; a smaller --context (or "
        "fewer KV slots or prefix-cache blocks) caps it",
        gib, n_slots, capacity, extra_blocks, config.n_layers, config.kv_dim,
        type == GgmlType::kF32 ? "f32" : "f16", static_cast<double>(memory) / (1024.0 * 1024 * 1024)));
  }
  c.n_blocks_ = static_cast<int64_t>(blocks);
  const int64_t total = static_cast<int64_t>(per_side);
  c.k_ = PageBuffer(static_cast<size_t>(total));
  c.v_ = PageBuffer(static_cast<size_t>(total));
  if (total > 0 && (c.k_.data() == nullptr || c.v_.data() == nullptr)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache: cannot map 2 x %d bytes", total));
  }
  c.length_.assign(n_slots, 0);
  c.table_.resize(n_slots * c.blocks_per_slot_);
  c.mapped_.resize(n_slots);
  for (int64_t s = 0; s < n_slots; ++s) c.Reset(s);
  return c;
}

void KvCache::Reset(int64_t slot) {
  length_[slot] = 0;
  for (int64_t i = 0; i < blocks_per_slot_; ++i) {
    table_[slot * blocks_per_slot_ + i] = static_cast<int32_t>(slot * blocks_per_slot_ + i);
  }
  mapped_[slot] = blocks_per_slot_;
}

absl::Status KvCache::Check(std::span<const KvSlotTable> tables,
                            std::span<const KvBlockCopy> copies) const {
  auto bad_block = [&](int64_t b) { return b < 0 || b >= n_blocks_; };
  for (size_t i = 0; i < copies.size(); ++i) {
    const KvBlockCopy& c = copies[i];
    if (bad_block(c.src) || bad_block(c.dst)) {
      return absl::InvalidArgumentError(absl::StrCat("KV block copy ", i, ": block ",
                                                     bad_block(c.src) ? c.src : c.dst,
                                                     " is not in the pool [0, ", n_blocks_, ")"));
    }
    if (c.src == c.dst) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV block copy ", i, ": block ", c.src, " onto itself"));
    }
  }
  std::vector<bool> seen(n_slots_, false);
  for (size_t i = 0; i < tables.size(); ++i) {
    const KvSlotTable& t = tables[i];
    if (t.slot < 0 || t.slot >= n_slots_) {
      return absl::InvalidArgumentError(absl::StrCat("KV table ", i, ": slot ", t.slot,
                                                     " is not in [0, ", n_slots_, ")"));
    }
    if (seen[t.slot]) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV table ", i, ": slot ", t.slot, " has a second table"));
    }
    seen[t.slot] = true;
    if (static_cast<int64_t>(t.blocks.size()) > blocks_per_slot_) {
      return absl::InvalidArgumentError(absl::StrCat("KV table ", i, " (slot ", t.slot, "): ",
                                                     t.blocks.size(), " blocks, more than the ",
                                                     blocks_per_slot_, " a slot holds"));
    }
    const int64_t covered =
        std::min<int64_t>(capacity_, static_cast<int64_t>(t.blocks.size()) * kKvBlockSize);
    if (t.length < 0 || t.length > covered) {
      return absl::InvalidArgumentError(absl::StrCat("KV table ", i, " (slot ", t.slot,
                                                     "): length ", t.length, " outside the ",
                                                     covered, " positions its blocks hold"));
    }
    for (size_t j = 0; j < t.blocks.size(); ++j) {
      if (bad_block(t.blocks[j])) {
        return absl::InvalidArgumentError(absl::StrCat("KV table ", i, " (slot ", t.slot,
                                                       "): block ", t.blocks[j], " at ", j,
                                                       " is not in the pool [0, ", n_blocks_,
                                                       ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KvCache::Apply(std::span<const KvSlotTable> tables,
                            std::span<const KvBlockCopy> copies) {
  if (absl::Status s = Check(tables, copies); !s.ok()) return s;
  const int64_t block_bytes = kKvBlockSize * row_bytes_;
  for (const KvBlockCopy& c : copies) {
    for (int64_t l = 0; l < n_layers_; ++l) {
      const int64_t src = (l * n_blocks_ + c.src) * block_bytes;
      const int64_t dst = (l * n_blocks_ + c.dst) * block_bytes;
      std::memcpy(k_.data() + dst, k_.data() + src, block_bytes);
      std::memcpy(v_.data() + dst, v_.data() + src, block_bytes);
    }
  }
  for (const KvSlotTable& t : tables) {
    std::copy(t.blocks.begin(), t.blocks.end(), table_.begin() + t.slot * blocks_per_slot_);
    mapped_[t.slot] = static_cast<int64_t>(t.blocks.size());
    length_[t.slot] = t.length;
  }
  return absl::OkStatus();
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
