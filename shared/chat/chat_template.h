// Chat templates: the Jinja2 text a GGUF carries in `tokenizer.chat_template`, rendered for a
// conversation exactly as Hugging Face's apply_chat_template renders it with Python's Jinja2
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols; tojson is
// json.dumps(ensure_ascii=False); raise_exception and strftime_now globals).
//
// The interpreter (shared/chat/) covers the Jinja2 subset that published chat templates use;
// docs/chat-templates.md lists what is supported and where it knowingly differs from Python.
// A template is untrusted input: every error is a Status (never a crash), and rendering is
// bounded in steps, output size and recursion (RenderLimits).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "shared/chat/interpreter.h"

namespace thermocline::chat {

// What apply_chat_template passes to the template.
struct ChatTemplateInputs {
  // A JSON array of message objects as in OpenAI's API: "role" (string) is required; "content"
  // may be a string, null or an array; other fields ("tool_calls", "tool_call_id", "name" ...)
  // pass through to the template unchanged.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // Tool (function) definitions, a JSON array; nullopt passes tools=None, as Hugging Face does.
  std::optional<nlohmann::ordered_json> tools;
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  // More template variables (a JSON object), e.g. {"date_string": "26 Jul 2024"}; they may
  // override the ones above.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // The clock strftime_now() reads (seconds since the epoch, local time); nullopt: now.
  std::optional<int64_t> now_unix_seconds;
};

class ChatTemplate {
 public:
  // Parses a template. Syntax errors (and unknown filters or tests, as in Jinja2) are
  // InvalidArgument with "line L, column C: ...".
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders for a conversation. Errors: InvalidArgument for bad inputs and for template errors
  // at run time (an undefined value used, a type error ...); FailedPrecondition for the
  // template's own raise_exception("..."), whose message it carries; ResourceExhausted when a
  // limit is hit.
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs,
                                     const RenderLimits& limits = {}) const;

  // Renders with arbitrary variables (a JSON object) and no chat-specific checks.
  absl::StatusOr<std::string> RenderWithVariables(const nlohmann::ordered_json& variables,
                                                  std::optional<int64_t> now_unix_seconds,
                                                  const RenderLimits& limits = {}) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

// Parse + Render.
absl::StatusOr<std::string> RenderChatTemplate(std::string_view source,
                                               const ChatTemplateInputs& inputs,
                                               const RenderLimits& limits = {});

// Checks `messages` against the shape ChatTemplateInputs describes; errors name the message
// index and the field.
absl::Status ValidateMessages(const nlohmann::ordered_json& messages);

}  // namespace thermocline::chat
