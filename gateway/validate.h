// Validation of the gateway's requests: every field of a GenerateRequest (and of the other
// calls) is checked before anything is queued, and a bad field is refused with
// INVALID_ARGUMENT naming the field and the value it got (docs/gateway.md#validation).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "gateway/scheduler.h"
#include "shared/tokenizer/tokenizer.h"
#include "thermocline/v1/generation.pb.h"

namespace thermocline::gateway {

struct RequestLimits {
  int32_t context = 0;               // positions per sequence (prompt + max_new_tokens)
  int32_t vocab_size = 0;
  int32_t max_prompt_bytes = 65536;  // text prompt, Tokenize text
  int32_t max_stop_strings = 16;
  int32_t max_stop_bytes = 256;
  int32_t max_stop_token_ids = 64;
  int32_t max_top_logprobs = 20;
  int32_t max_request_id = 128;
};

// A Job ready for the scheduler, or INVALID_ARGUMENT naming the first bad field. An unset seed
// is drawn here (and reported in Final.seed).
absl::StatusOr<Job> ValidateGenerate(const v1::GenerateRequest& request,
                                     const RequestLimits& limits, const Tokenizer& tokenizer);
absl::Status ValidateTokenize(const v1::TokenizeRequest& request, const RequestLimits& limits);
absl::Status ValidateDetokenize(const v1::DetokenizeRequest& request,
                                const RequestLimits& limits);

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool IsValidUtf8(std::string_view s);

}  // namespace thermocline::gateway
