// ForwardPass as a BatchRunner with the prefix cache: a KvBlockManager (kv_blocks.h) decides
// which blocks each slot's positions use, this process's KvCache follows its tables. The
// single-process counterpart of what the split engine does across the gpu_worker's ring, on the
// same KvCache code; the prefix-cache bench and tests run it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shared/runtime/generate.h"
#include "shared/runtime/kv_blocks.h"

namespace thermocline {

class PagedForwardRunner final : public BatchRunner {
 public:
  // `pass`'s KvCache must have been created with `extra_blocks` (its pool is the manager's).
  PagedForwardRunner(ForwardPass& pass, int32_t extra_blocks, bool enabled)
      : pass_(pass),
        blocks_(static_cast<int32_t>(pass.kv_cache().n_slots()),
                static_cast<int32_t>(pass.kv_cache().capacity()), extra_blocks, enabled) {}

  absl::Status Run(std::span<const BatchEntry> batch, std::vector<float>& logits) override;
  int64_t vocab_size() const override { return pass_.model().config().vocab_size; }
  int64_t context() const override { return pass_.kv_cache().capacity(); }
  void ResetSlot(int32_t slot) override;
  int32_t ReusePrefix(int32_t slot, std::span<const int32_t> tokens) override;
  absl::Status ForkSlot(int32_t src, int32_t dst, int32_t n) override;
  PrefixCacheStats prefix_cache_stats() const override { return blocks_.stats(); }
  const KvBlockManager& blocks() const { return blocks_; }

 private:
  ForwardPass& pass_;
  KvBlockManager blocks_;
};

}  // namespace thermocline
