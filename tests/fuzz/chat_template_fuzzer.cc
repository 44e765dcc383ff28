// libFuzzer target: the chat-template engine (shared/chat/) on arbitrary template text. The
// input is the template; it is parsed and, when it parses, rendered for a fixed conversation
// with system, user, assistant, tool-call and tool turns, tools, and both values of
// add_generation_prompt. Any outcome is fine except a crash, a sanitizer report, a leak, or a
// result that breaks the engine's contract: an OK render within the output limit, or an error
// status with a message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "nlohmann/json.hpp"
#include "shared/chat/chat_template.h"

namespace {

const thermocline::chat::ChatTemplateInputs& Inputs() {
  static const auto* in = [] {
    auto* x = new thermocline::chat::ChatTemplateInputs;
    x->messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris? é 世界 🌍"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "1", "content": "21C"},
      {"role": "assistant", "content": "<think>x</think>It is 21C."},
      {"role": "user", "content": ""}])");
    x->tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string",
        "description": "City", "enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}])");
    x->bos_token = "<s>";
    x->eos_token = "</s>";
    x->now_unix_seconds = 1721995200;
    return x;
  }();
  return *in;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<thermocline::chat::ChatTemplate> t =
      thermocline::chat::ChatTemplate::Parse(source);
  if (!t.ok()) {
    if (t.status().message().empty()) std::abort();
    return 0;
  }
  // Small limits keep each execution short; the limits themselves are what is exercised.
  thermocline::chat::RenderLimits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = 1 << 20;
  thermocline::chat::ChatTemplateInputs in = Inputs();
  for (bool agp : {false, true}) {
    in.add_generation_prompt = agp;
    absl::StatusOr<std::string> out = t->Render(in, limits);
    if (out.ok() ? out->size() > limits.max_output_bytes : out.status().message().empty()) {
      std::abort();
    }
  }
  return 0;
}
