// Prompt processing plus a decode loop for one sequence in one slot: the local (single-process)
// generation path behind `thermocline generate`.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/kv_blocks.h"
#include "shared/runtime/sampler.h"

namespace thermocline {

// Structured output in local generation (tools/cmd_generate.cc makes one from a grammar; the
// runtime knows no grammar): which tokens the next sample may take, and which one it took.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // allowed[id] for the next token (EOS included); an error ends the generation with it.
  virtual absl::StatusOr<std::span<const uint8_t>> Allowed() = 0;
  // `token` (not EOS) was sampled and printed; true when nothing can follow it (the
  // generation ends there).
  virtual bool Taken(int32_t token) = 0;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included if wanted
  int32_t max_new_tokens = 128;
  SamplingParams sampling;
  bool ignore_eos = false;
  int32_t prefill_chunk = 256;  // positions per forward call while processing the prompt
  int32_t slot = 0;
  TokenConstraint* constraint = nullptr;  // none: sampling as without one
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  int64_t decode_steps = 0;    // single-token forward passes after the prompt
  double decode_seconds = 0;  // time spent in sampling and those passes
  bool stopped_at_eos = false;
  bool stopped_by_constraint = false;  // the constraint's text was complete
};

// What generation runs on: a batch of (slot, position, token) entries in, one logits row per
// entry that wants logits out, with ForwardPass::Run's contract. ForwardPass runs it in this
// process; the split engine (shared/driver/) runs it in the two worker processes.
class BatchRunner {
 public:
  virtual ~BatchRunner() = default;
  virtual absl::Status Run(std::span<const BatchEntry> batch, std::vector<float>& logits) = 0;
  virtual int64_t vocab_size() const = 0;
  // Positions each slot holds.
  virtual int64_t context() const = 0;
  // Forgets a slot's sequence; its next entry starts at position 0.
  virtual void ResetSlot(int32_t slot) = 0;

  // Prefix cache (kv_blocks.h), for runners that page their KV cache. ReusePrefix maps the
  // longest cached prefix of `tokens` into the empty `slot` and returns how many positions it
  // now holds: the caller's next entry for the slot is at that position. 0: nothing reused.
  virtual int32_t ReusePrefix(int32_t /*slot*/, std::span<const int32_t> /*tokens*/) {
    return 0;
  }
  // The empty `dst` holds the first n positions of `src` from now on, without computing them
  // (n > 1 choices of one prompt). FailedPrecondition where the runner cannot share.
  virtual absl::Status ForkSlot(int32_t /*src*/, int32_t /*dst*/, int32_t /*n*/) {
    return absl::FailedPreconditionError("this runner does not share KV blocks");
  }
  virtual PrefixCacheStats prefix_cache_stats() const { return {}; }
};

// ForwardPass as a BatchRunner: the slot's KV cache is the sequence.
class ForwardPassRunner final : public BatchRunner {
 public:
  explicit ForwardPassRunner(ForwardPass& pass) : pass_(pass) {}
  absl::Status Run(std::span<const BatchEntry> batch, std::vector<float>& logits) override {
    return pass_.Run(batch, logits);
  }
  int64_t vocab_size() const override { return pass_.model().config().vocab_size; }
  int64_t context() const override { return pass_.kv_cache().capacity(); }
  void ResetSlot(int32_t slot) override { pass_.kv_cache().Reset(slot); }

 private:
  ForwardPass& pass_;
};

// Called with each generated token and the logits it was sampled from; return false to stop.
using TokenCallback = std::function<bool(int32_t token, std::span<const float> logits)>;

// Runs the prompt from position 0 of `request.slot` (the slot is reset), then samples up to
// max_new_tokens tokens, stopping early at EOS unless ignore_eos. Fails with a clear error when
// the prompt is empty or prompt + max_new_tokens does not fit the KV cache.
absl::StatusOr<GenerationStats> Generate(ForwardPass& pass, const GenerationRequest& request,
                                         const TokenCallback& on_token);
// The same on any runner; `eos` is the tokenizer's end-of-sequence id.
absl::StatusOr<GenerationStats> Generate(BatchRunner& runner, int32_t eos,
                                         const GenerationRequest& request,
                                         const TokenCallback& on_token);

}  // namespace thermocline
