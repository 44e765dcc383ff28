#include "shared/runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "shared/util/status_macros.h"

namespace thermocline {
namespace {
double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

absl::StatusOr<GenerationStats> Generate(ForwardPass& pass, const GenerationRequest& request,
                                         const TokenCallback& on_token) {
  ForwardPassRunner runner(pass);
  return Generate(runner, pass.model().tokenizer().eos(), request, on_token);
}

absl::StatusOr<GenerationStats> Generate(BatchRunner& pass, int32_t eos,
                                         const GenerationRequest& request,
                                         const TokenCallback& on_token) {
  TC_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  const int64_t n_prompt = static_cast<int64_t>(request.prompt.size());
  if (n_prompt == 0) return absl::InvalidArgumentError("generate: the prompt has no tokens");
  if (request.max_new_tokens < 0) {
    return absl::InvalidArgumentError("generate: max_new_tokens must be >= 0");
  }
  if (n_prompt + request.max_new_tokens > pass.context()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generate: prompt (", n_prompt, " tokens) + max_new_tokens (", request.max_new_tokens,
        ") exceeds the context of ", pass.context(), " positions"));
  }
  const int64_t vocab = pass.vocab_size();
  pass.ResetSlot(request.slot);

  GenerationStats stats;
  stats.prompt_tokens = n_prompt;
  std::vector<int32_t> history = request.prompt;
  std::vector<float> logits;
  std::vector<BatchEntry> batch;
  const int64_t chunk = std::max<int32_t>(1, request.prefill_chunk);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t begin = 0; begin < n_prompt; begin += chunk) {
    const int64_t end = std::min(n_prompt, begin + chunk);
    batch.clear();
    for (int64_t p = begin; p < end; ++p) {
      batch.push_back({request.slot, static_cast<int32_t>(p), request.prompt[p], p == n_prompt - 1});
    }
    TC_RETURN_IF_ERROR(pass.Run(batch, logits));
  }
  stats.prefill_seconds = SecondsSince(t0);

  Sampler sampler(request.sampling);
  t0 = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < request.max_new_tokens; ++i) {
    TC_RETURN_IF_ERROR(CheckFiniteLogits(std::span<const float>(logits.data(), vocab),
                                         static_cast<int64_t>(history.size()) - 1));
    std::span<const uint8_t> allowed;
    if (request.constraint != nullptr) {
      absl::StatusOr<std::span<const uint8_t>> a = request.constraint->Allowed();
      if (!a.ok()) return a.status();
      allowed = *a;
    }
    const int32_t token =
        sampler.Sample(std::span<const float>(logits.data(), vocab), history, allowed);
    history.push_back(token);
    if (token == eos && !request.ignore_eos) {
      stats.stopped_at_eos = true;
      break;
    }
    ++stats.generated_tokens;
    if (!on_token(token, std::span<const float>(logits.data(), vocab))) break;
    if (request.constraint != nullptr && request.constraint->Taken(token)) {
      stats.stopped_by_constraint = true;
      break;
    }
    if (i + 1 == request.max_new_tokens) break;  // no forward pass for a token nobody samples from
    BatchEntry e{request.slot, static_cast<int32_t>(history.size() - 1), token, true};
    TC_RETURN_IF_ERROR(pass.Run(std::span<const BatchEntry>(&e, 1), logits));
    ++stats.decode_steps;
  }
  stats.decode_seconds = SecondsSince(t0);
  return stats;
}

}  // namespace thermocline
