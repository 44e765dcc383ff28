#include "shared/chat/chat_template.h"

#include <ctime>
#include <new>

#include "shared/chat/json_value.h"
#include "shared/chat/parser.h"
#include "shared/util/status_macros.h"

namespace thermocline::chat {

namespace {

absl::Status ToStatus(const TemplateError& e) {
  std::string where = "chat template";
  if (e.has_position()) {
    where += " line " + std::to_string(e.line()) + ", column " + std::to_string(e.column());
  }
  return absl::Status(e.code(), where + ": " + e.message());
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  try {
    return ChatTemplate(std::make_shared<const Body>(ParseTemplate(source)));
  } catch (const TemplateError& e) {
    return ToStatus(e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("chat template: out of memory while parsing");
  }
}

absl::StatusOr<std::string> ChatTemplate::RenderWithVariables(
    const nlohmann::ordered_json& variables, std::optional<int64_t> now_unix_seconds,
    const RenderLimits& limits) const {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError("chat template variables must be a JSON object");
  }
  try {
    std::vector<std::pair<std::string, Value>> context;
    for (const auto& [k, v] : variables.items()) context.emplace_back(k, FromJson(v));
    Interpreter interp(limits, now_unix_seconds.value_or(static_cast<int64_t>(std::time(nullptr))));
    return interp.Render(*body_, std::move(context));
  } catch (const TemplateError& e) {
    return ToStatus(e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("chat template: out of memory while rendering");
  }
}

absl::Status ValidateMessages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) {
    return absl::InvalidArgumentError("messages must be a JSON array of message objects");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return absl::InvalidArgumentError(at + " is not a JSON object");
    const auto role = m.find("role");
    if (role == m.end()) return absl::InvalidArgumentError(at + " has no \"role\"");
    if (!role->is_string()) return absl::InvalidArgumentError(at + ".role is not a string");
    const auto content = m.find("content");
    if (content != m.end() && !content->is_string() && !content->is_null() &&
        !content->is_array()) {
      return absl::InvalidArgumentError(at + ".content must be a string, null or an array");
    }
    const auto calls = m.find("tool_calls");
    if (calls != m.end() && !calls->is_array() && !calls->is_null()) {
      return absl::InvalidArgumentError(at + ".tool_calls must be an array");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs,
                                                 const RenderLimits& limits) const {
  TC_RETURN_IF_ERROR(ValidateMessages(inputs.messages));
  if (inputs.tools && !inputs.tools->is_array()) {
    return absl::InvalidArgumentError("tools must be a JSON array");
  }
  if (!inputs.extra.is_object()) {
    return absl::InvalidArgumentError("extra template variables must be a JSON object");
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = inputs.messages;
  vars["tools"] = inputs.tools ? *inputs.tools : nlohmann::ordered_json(nullptr);
  vars["add_generation_prompt"] = inputs.add_generation_prompt;
  vars["bos_token"] = inputs.bos_token;
  vars["eos_token"] = inputs.eos_token;
  for (const auto& [k, v] : inputs.extra.items()) vars[k] = v;
  return RenderWithVariables(vars, inputs.now_unix_seconds, limits);
}

absl::StatusOr<std::string> RenderChatTemplate(std::string_view source,
                                               const ChatTemplateInputs& inputs,
                                               const RenderLimits& limits) {
  TC_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(source));
  return t.Render(inputs, limits);
}

}  // namespace thermocline::chat
