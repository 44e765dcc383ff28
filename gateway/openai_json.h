// The OpenAI wire format of the HTTP API (docs/http.md), without any HTTP: a request body (JSON)
// becomes the gRPC API's ChatRequest or GenerateRequest, so that gateway/validate.h checks it
// with the same limits and messages as a gRPC call, and the scheduler's GenerateResponse
// messages become OpenAI's response objects and stream chunks.
//
// Only the request's JSON shape is checked here: a field of the wrong type is refused naming
// it (`param`), unknown fields are ignored, and fields the gateway cannot honour yet (n > 16,
// echo, best_of, suffix, logit_bias) are refused by name rather than silently dropped. Ranges
// and sizes are validate.cc's; so is compiling `grammar` and `response_format` (json_object,
// json_schema), which become the proto's grammar / json_schema fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "shared/tokenizer/tokenizer.h"
#include "thermocline/v1/generation.pb.h"

namespace thermocline::gateway {

using OpenAiJson = nlohmann::ordered_json;

// An error as OpenAI's API shapes it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string param;  // the request field at fault; "" = null
  std::string code;   // a short machine-readable word; "" = null
};
OpenAiJson ErrorBody(const ApiError& error);
// A gateway status as an ApiError: INVALID_ARGUMENT and FAILED_PRECONDITION 400,
// UNAUTHENTICATED 401, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503,
// DEADLINE_EXCEEDED 504, anything else 500. `param` is the field the message starts with,
// under its HTTP name (e.g. "max_new_tokens" of the proto is "max_tokens" here, and the message
// says so too).
ApiError FromStatus(const absl::Status& status, const std::string& max_tokens_name);

// The body parsed as JSON (nested at most `max_depth` levels); errors name the body.
bool ParseBody(const std::string& body, int max_depth, OpenAiJson* out, ApiError* error);

// One /v1/chat/completions or /v1/completions request.
struct CompletionRequest {
  bool chat = false;
  v1::ChatRequest chat_request;          // chat
  v1::GenerateRequest generate_request;  // completions
  std::string model;                     // as given ("" = not given)
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  int32_t n = 1;                         // choices; each i > 0 runs with seed + i
  bool max_tokens_given = false;         // else: chat to the context's end, completions 16
  std::string max_tokens_name = "max_tokens";  // the field the caller used, for messages
};
// `body` as a request of the given endpoint: false with *error naming the field when a field
// has the wrong type or asks for what is not supported. Sampling fields the caller leaves out
// take OpenAI's defaults (temperature 1, top_p 1, no top_k, no min_p), not thermocline
// generate's.
bool ParseCompletionRequest(const OpenAiJson& body, bool chat, CompletionRequest* out,
                            ApiError* error);

// Response shapes. `id`, `created` and `model` are the same in every chunk of a response.
struct ResponseHeader {
  std::string id;
  int64_t created = 0;
  std::string model;
};
// OpenAI's finish_reason of a Final: "stop" (EOS, a stop token or string), "length", "abort"
// (the gateway shut down mid-stream, as vLLM says).
std::string FinishReasonName(v1::FinishReason reason);
// The logprobs object of one choice (or of one stream chunk) from its TokenLogprob entries;
// a token's text is its decoded text on its own, as the scheduler gives the alternatives'.
OpenAiJson ChatLogprobs(const std::vector<v1::TokenLogprob>& lps, const Tokenizer& tokenizer);
// Completions' older shape; text_offset counts from `offset` (bytes of completion text so far).
OpenAiJson CompletionLogprobs(const std::vector<v1::TokenLogprob>& lps,
                              const Tokenizer& tokenizer, int64_t offset);
OpenAiJson UsageJson(int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace thermocline::gateway
