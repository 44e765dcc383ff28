#include "shared/runtime/paged_runner.h"

#include "absl/strings/str_cat.h"

namespace thermocline {

absl::Status PagedForwardRunner::Run(std::span<const BatchEntry> batch,
                                     std::vector<float>& logits) {
  KvCache& kv = pass_.kv_cache();
  if (blocks_.n_blocks() != kv.n_blocks()) {
    return absl::FailedPreconditionError(absl::StrCat("paged runner: the manager has ",
                                                      blocks_.n_blocks(), " blocks, the cache ",
                                                      kv.n_blocks()));
  }
  absl::StatusOr<KvPlan> plan = blocks_.Prepare(batch);
  if (!plan.ok()) return plan.status();
  if (absl::Status s = kv.Apply(plan->tables, plan->copies); !s.ok()) return s;
  if (absl::Status s = pass_.Run(batch, logits); !s.ok()) return s;
  blocks_.Commit(batch);
  return absl::OkStatus();
}

void PagedForwardRunner::ResetSlot(int32_t slot) {
  blocks_.Release(slot);
  pass_.kv_cache().Reset(slot);
}

int32_t PagedForwardRunner::ReusePrefix(int32_t slot, std::span<const int32_t> tokens) {
  return blocks_.AttachPrefix(slot, tokens);
}

absl::Status PagedForwardRunner::ForkSlot(int32_t src, int32_t dst, int32_t n) {
  return blocks_.Fork(src, dst, n);
}

}  // namespace thermocline
