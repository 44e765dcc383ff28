#include "shared/driver/slot_history.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace thermocline::driver {

SlotHistory::SlotHistory(int32_t n_slots, int32_t context)
    : context_(context), slots_(std::max(0, n_slots)) {}

absl::Status SlotHistory::Validate(std::span<const ipc::StepEntry> entries) const {
  // Running lengths of the slots this step touches: later entries of one slot may continue
  // the positions of earlier ones in the same step.
  absl::flat_hash_map<int32_t, int64_t> length;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ipc::StepEntry& e = entries[i];
    if (e.kv_slot < 0 || e.kv_slot >= n_slots()) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", i, ": kv slot ", e.kv_slot,
                                                     " outside [0, ", n_slots(), ")"));
    }
    if (e.position < 0 || e.position >= context_) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", i, ": position ", e.position,
                                                     " outside the context [0, ", context_, ")"));
    }
    auto [it, inserted] = length.try_emplace(e.kv_slot, 0);
    if (inserted) it->second = static_cast<int64_t>(slots_[e.kv_slot].size());
    if (e.position > it->second) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry ", i, ": position ", e.position, " of slot ", e.kv_slot,
                       ", which holds ", it->second, " positions (a position may be at most the "
                       "slot's length)"));
    }
    it->second = e.position + 1;
  }
  return absl::OkStatus();
}

void SlotHistory::Apply(std::span<const ipc::StepEntry> entries) {
  for (const ipc::StepEntry& e : entries) {
    std::vector<int32_t>& tokens = slots_[e.kv_slot];
    tokens.resize(e.position);  // a rewind drops what followed, as the KV cache's length does
    tokens.push_back(e.token_id);
  }
}

void SlotHistory::Release(int32_t slot) {
  if (slot >= 0 && slot < n_slots()) {
    slots_[slot].clear();
    slots_[slot].shrink_to_fit();
  }
}

void SlotHistory::Adopt(int32_t slot, std::span<const int32_t> tokens) {
  if (slot >= 0 && slot < n_slots()) slots_[slot].assign(tokens.begin(), tokens.end());
}

int64_t SlotHistory::total_tokens() const {
  int64_t n = 0;
  for (const auto& s : slots_) n += static_cast<int64_t>(s.size());
  return n;
}

std::vector<std::vector<ipc::StepEntry>> SlotHistory::ReplaySteps(int32_t max_batch) const {
  std::vector<std::vector<ipc::StepEntry>> steps;
  const size_t chunk = static_cast<size_t>(std::max(1, max_batch));
  std::vector<ipc::StepEntry> step;
  for (int32_t slot = 0; slot < n_slots(); ++slot) {
    const std::vector<int32_t>& tokens = slots_[slot];
    for (size_t p = 0; p < tokens.size(); ++p) {
      step.push_back(ipc::StepEntry{slot, static_cast<int32_t>(p), tokens[p], 0});
      if (step.size() == chunk) {
        steps.push_back(std::move(step));
        step.clear();
      }
    }
  }
  if (!step.empty()) steps.push_back(std::move(step));
  return steps;
}

}  // namespace thermocline::driver
