// The greedy decode loop the split and GPU benchmarks time, shared so that both measure the same
// thing: a kPrompt-token prefill (not timed), then one single-entry step per token.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "bench/bench_util.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"

namespace thermocline::bench {

inline constexpr int kPrompt = 8;

// Prefills kPrompt tokens, then decodes `tokens` greedily, one step at a time; appends each
// decode step's seconds to `times` and the decoded tokens to `out`.
inline absl::Status Decode(BatchRunner& runner, int tokens, std::vector<double>& times,
                           std::vector<int32_t>& out) {
  runner.ResetSlot(0);
  std::vector<BatchEntry> batch;
  for (int p = 0; p < kPrompt; ++p) batch.push_back({0, p, 3 + p, p == kPrompt - 1});
  std::vector<float> logits;
  if (absl::Status s = runner.Run(batch, logits); !s.ok()) return s;
  for (int i = 0; i < tokens; ++i) {
    const int32_t next = static_cast<int32_t>(
        std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    BatchEntry e{0, kPrompt + i, next, true};
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = runner.Run(std::span<const BatchEntry>(&e, 1), logits); !s.ok()) return s;
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return absl::OkStatus();
}

}  // namespace thermocline::bench
