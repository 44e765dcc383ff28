// Validation of the gateway's requests: every field of a GenerateRequest (and of the other
// calls) is checked before anything is queued, and a bad field is refused with
// INVALID_ARGUMENT naming the field and the value it got (docs/gateway.md#validation).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "gateway/scheduler.h"
#include "shared/chat/chat_template.h"
#include "shared/tokenizer/chat_prompt.h"
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
  // Chat: messages per request; bytes of a request's own template. The conversation's strings
  // (with tools and template_kwargs) count against max_prompt_bytes.
  int32_t max_chat_messages = 1024;
  int32_t max_chat_template_bytes = 65536;
  // JSON (tool_calls, tools, template_kwargs) nested deeper than this is refused.
  int32_t max_json_depth = 64;
  // Rendering a template: a template is untrusted input. The rendered prompt must then fit
  // the context anyway, so 1 MiB of text is far beyond any servable prompt.
  chat::RenderLimits render = {.max_steps = 5'000'000, .max_output_bytes = size_t{1} << 20,
                               .max_depth = 400};
};

// The served model's chat template, prepared once at startup from its GGUF header.
struct ModelChat {
  std::string model;  // the file's name, for errors
  bool has_template = false;  // the file has tokenizer.chat_template
  // The parsed template; nullopt when there is none or it does not parse (`parse_error`).
  std::optional<chat::ChatTemplate> parsed;
  absl::Status parse_error;
  std::string bos_token, eos_token;  // what the template is rendered with
  // The named variants (tokenizer.chat_template.NAME) by NAME: parsed, or why not.
  std::map<std::string, absl::StatusOr<chat::ChatTemplate>> named;
};
ModelChat PrepareModelChat(const std::string& model_name, const ModelChatTemplate& source);

// A Job ready for the scheduler, or INVALID_ARGUMENT naming the first bad field. An unset seed
// is drawn here (and reported in Final.seed).
absl::StatusOr<Job> ValidateGenerate(const v1::GenerateRequest& request,
                                     const RequestLimits& limits, const Tokenizer& tokenizer);
// A Job from a Chat call: the fields checked (roles, sizes, JSON of tool_calls, tools and
// template_kwargs), the conversation rendered through the request's template or the model's
// (FAILED_PRECONDITION naming the model when neither exists; INVALID_ARGUMENT with the
// template's message when it fails), the prompt tokenized by EncodeChatPrompt, then the
// generation fields as ValidateGenerate checks them. Unless ignore_eos, every EOG id of the
// vocabulary is a stop token.
absl::StatusOr<Job> ValidateChat(const v1::ChatRequest& request, const RequestLimits& limits,
                                 const Tokenizer& tokenizer, const ModelChat& model_chat);
absl::Status ValidateTokenize(const v1::TokenizeRequest& request, const RequestLimits& limits);
absl::Status ValidateDetokenize(const v1::DetokenizeRequest& request,
                                const RequestLimits& limits);

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool IsValidUtf8(std::string_view s);

}  // namespace thermocline::gateway
