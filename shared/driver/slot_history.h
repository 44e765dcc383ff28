// What the driver has submitted to each KV slot: the token at every position 0..n-1, as the
// gpu_worker's KV cache holds it after the steps that succeeded. A restarted gpu_worker starts
// with empty caches; ReplaySteps turns this record back into prefill steps that rebuild them.
//
// Positions follow ForwardPass::Run: an entry's position is at most its slot's current length
// (counting earlier entries of the same step); equal appends, smaller rewinds the slot to that
// position and overwrites it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "shared/ipc/messages.h"

namespace thermocline::driver {

class SlotHistory {
 public:
  // `n_slots` KV slots of `context` positions each.
  SlotHistory(int32_t n_slots, int32_t context);

  // Checks what a worker would refuse, before anything is sent: slot in range, position in
  // [0, context) and at most the slot's running length. The error names the entry.
  absl::Status Validate(std::span<const ipc::StepEntry> entries) const;
  // Records a step the gpu_worker completed (entries already validated).
  void Apply(std::span<const ipc::StepEntry> entries);
  // Forgets a slot (its sequence ended); nothing of it is replayed.
  void Release(int32_t slot);
  // The empty slot holds `tokens` without a step: KV blocks of the prefix cache mapped into it
  // (a restarted gpu_worker recomputes them by replay like any other position).
  void Adopt(int32_t slot, std::span<const int32_t> tokens);

  int32_t n_slots() const { return static_cast<int32_t>(slots_.size()); }
  int32_t context() const { return context_; }
  const std::vector<int32_t>& tokens(int32_t slot) const { return slots_[slot]; }
  // Tokens held over all slots (what a full replay submits).
  int64_t total_tokens() const;

  // Prefill steps that rebuild every slot with tokens in a fresh gpu_worker: positions 0..n-1 of
  // each slot in order, no logits wanted, at most `max_batch` entries per step (a step may mix
  // the end of one slot with the start of the next: each entry names its slot).
  std::vector<std::vector<ipc::StepEntry>> ReplaySteps(int32_t max_batch) const;

 private:
  int32_t context_;
  std::vector<std::vector<int32_t>> slots_;
};

}  // namespace thermocline::driver
