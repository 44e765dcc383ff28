#include "gateway/validate.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "shared/grammar/gbnf.h"
#include "shared/grammar/json_schema.h"
#include "shared/grammar/matcher.h"

namespace thermocline::gateway {
namespace {

absl::Status Bad(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// Checks a float field that must be finite and in [lo, hi] (lo_open: lo excluded). NaN fails
// every comparison, so it is named separately rather than slipping through.
absl::Status CheckFloat(const char* field, float v, float lo, float hi, bool lo_open) {
  if (!std::isfinite(v)) return Bad(absl::StrCat(field, " must be a finite number, got ", v));
  if (lo_open ? !(v > lo) : !(v >= lo)) {
    return Bad(absl::StrCat(field, " must be ", lo_open ? "> " : ">= ", lo, ", got ", v));
  }
  if (!(v <= hi)) return Bad(absl::StrCat(field, " must be <= ", hi, ", got ", v));
  return absl::OkStatus();
}

#define TC_CHECK_OK(expr)                  \
  do {                                     \
    absl::Status _s = (expr);              \
    if (!_s.ok()) return _s;               \
  } while (0)

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + static_cast<size_t>(n) >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

namespace {

// Fields 3 to 17, which GenerateRequest and ChatRequest share (same numbers and meaning), into
// `job`, whose prompt is already set.
template <class Request>
absl::Status CheckGenerationFields(const Request& r, const RequestLimits& limits, Job& job) {
  const int64_t n_prompt = static_cast<int64_t>(job.prompt.size());
  if (r.max_new_tokens() < 1) {
    return Bad(absl::StrCat("max_new_tokens must be >= 1, got ", r.max_new_tokens()));
  }
  if (r.max_new_tokens() > limits.context) {
    return Bad(absl::StrCat("max_new_tokens must be <= the context of ", limits.context,
                            ", got ", r.max_new_tokens()));
  }
  if (n_prompt + r.max_new_tokens() > limits.context) {
    return Bad(absl::StrCat("prompt (", n_prompt, " tokens) + max_new_tokens (",
                            r.max_new_tokens(), ") exceeds the context of ", limits.context,
                            " positions"));
  }
  job.max_new_tokens = r.max_new_tokens();

  // Sampling: unset fields keep SamplingParams' defaults (those of `thermocline generate`).
  SamplingParams& sp = job.sampling;
  if (r.has_temperature()) {
    TC_CHECK_OK(CheckFloat("temperature", r.temperature(), 0, 1000, false));
    sp.temperature = r.temperature();
  }
  if (r.has_top_k()) {
    if (r.top_k() < 0 || r.top_k() > limits.vocab_size) {
      return Bad(absl::StrCat("top_k must be in [0, ", limits.vocab_size, "], got ", r.top_k()));
    }
    sp.top_k = r.top_k();
  }
  if (r.has_top_p()) {
    TC_CHECK_OK(CheckFloat("top_p", r.top_p(), 0, 1, true));
    sp.top_p = r.top_p();
  }
  if (r.has_min_p()) {
    TC_CHECK_OK(CheckFloat("min_p", r.min_p(), 0, 1, false));
    sp.min_p = r.min_p();
  }
  if (r.has_repetition_penalty()) {
    TC_CHECK_OK(CheckFloat("repetition_penalty", r.repetition_penalty(), 0, 100, true));
    sp.repetition_penalty = r.repetition_penalty();
  }
  if (r.has_presence_penalty()) {
    TC_CHECK_OK(CheckFloat("presence_penalty", r.presence_penalty(), -2, 2, false));
    sp.presence_penalty = r.presence_penalty();
  }
  if (r.has_frequency_penalty()) {
    TC_CHECK_OK(CheckFloat("frequency_penalty", r.frequency_penalty(), -2, 2, false));
    sp.frequency_penalty = r.frequency_penalty();
  }
  if (r.has_seed()) {
    sp.seed = r.seed();
  } else {
    // Drawn, not 0: two unseeded requests should not sample alike. Reported in Final.seed.
    std::random_device rd;
    sp.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  // The sampler's own range checks, so that the gateway never accepts what it would refuse.
  if (absl::Status s = ValidateSamplingParams(sp); !s.ok()) return Bad(std::string(s.message()));

  if (r.stop_size() > limits.max_stop_strings) {
    return Bad(absl::StrCat("stop must hold at most ", limits.max_stop_strings,
                            " strings, got ", r.stop_size()));
  }
  for (int i = 0; i < r.stop_size(); ++i) {
    const std::string& s = r.stop(i);
    if (s.empty()) return Bad(absl::StrCat("stop[", i, "] must not be empty"));
    if (s.size() > static_cast<size_t>(limits.max_stop_bytes)) {
      return Bad(absl::StrCat("stop[", i, "] must be at most ", limits.max_stop_bytes,
                              " bytes, got ", s.size()));
    }
    if (!IsValidUtf8(s)) return Bad(absl::StrCat("stop[", i, "] must be valid UTF-8"));
    job.stop.push_back(s);
  }
  if (r.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Bad(absl::StrCat("stop_token_ids must hold at most ", limits.max_stop_token_ids,
                            " ids, got ", r.stop_token_ids_size()));
  }
  for (int i = 0; i < r.stop_token_ids_size(); ++i) {
    const int32_t id = r.stop_token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Bad(absl::StrCat("stop_token_ids[", i, "] must be in [0, ", limits.vocab_size,
                              "), got ", id));
    }
    job.stop_token_ids.push_back(id);
  }
  job.ignore_eos = r.ignore_eos();

  if (r.top_logprobs() < 0 || r.top_logprobs() > limits.max_top_logprobs) {
    return Bad(absl::StrCat("top_logprobs must be in [0, ", limits.max_top_logprobs, "], got ",
                            r.top_logprobs()));
  }
  if (r.top_logprobs() > 0 && !r.logprobs()) {
    return Bad(absl::StrCat("top_logprobs (", r.top_logprobs(), ") needs logprobs = true"));
  }
  job.logprobs = r.logprobs();
  job.top_logprobs = r.top_logprobs();

  if (r.request_id().size() > static_cast<size_t>(limits.max_request_id)) {
    return Bad(absl::StrCat("request_id must be at most ", limits.max_request_id,
                            " characters, got ", r.request_id().size()));
  }
  for (char c : r.request_id()) {
    // Printable ASCII only: it goes into log lines and must not forge or break them.
    if (c < 0x21 || c > 0x7E) {
      return Bad("request_id must hold printable ASCII characters only (no spaces)");
    }
  }
  job.request_id = r.request_id();

  // Structured output: compiled once, here; the scheduler only runs it.
  if (!r.grammar().empty() && !r.json_schema().empty()) {
    return Bad("grammar and json_schema cannot both be given (json_schema: response_format)");
  }
  const std::pair<const char*, const std::string*> sources[] = {{"grammar", &r.grammar()},
                                                                {"json_schema", &r.json_schema()}};
  for (const auto& [field, source] : sources) {
    const std::string& text = *source;
    if (text.empty()) continue;
    if (text.size() > static_cast<size_t>(limits.max_prompt_bytes)) {
      return Bad(absl::StrCat(field, " must be at most ", limits.max_prompt_bytes,
                              " bytes, got ", text.size()));
    }
    if (!IsValidUtf8(text)) return Bad(absl::StrCat(field, " must be valid UTF-8"));
    std::string gbnf = text;
    if (std::string_view(field) == "json_schema") {
      absl::StatusOr<std::string> compiled = grammar::JsonSchemaToGbnf(text);
      if (!compiled.ok()) return Bad(absl::StrCat(field, ": ", compiled.status().message()));
      gbnf = *std::move(compiled);
    }
    absl::StatusOr<grammar::Grammar> parsed = grammar::ParseGbnf(gbnf);
    if (!parsed.ok()) return Bad(absl::StrCat(field, ": ", parsed.status().message()));
    auto g = std::make_shared<const grammar::Grammar>(*std::move(parsed));
    if (grammar::IsComplete(grammar::InitialState(*g))) {
      return Bad(absl::StrCat(field, " matches only the empty text: nothing to generate"));
    }
    job.grammar = std::move(g);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Job> ValidateGenerate(const v1::GenerateRequest& r, const RequestLimits& limits,
                                     const Tokenizer& tokenizer) {
  Job job;
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText:
      if (r.text().empty()) return Bad("prompt text must not be empty");
      if (r.text().size() > static_cast<size_t>(limits.max_prompt_bytes)) {
        return Bad(absl::StrCat("prompt text must be at most ", limits.max_prompt_bytes,
                                " bytes, got ", r.text().size()));
      }
      if (!IsValidUtf8(r.text())) return Bad("prompt text must be valid UTF-8");
      // BOS (and EOS) as the vocabulary says, as llama.cpp does (gpt-2-style BPE adds none).
      job.prompt = tokenizer.Encode(r.text(), EncodeOptions{.add_special = true});
      break;
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = r.token_ids().ids();
      if (ids.empty()) return Bad("prompt token_ids must not be empty");
      if (ids.size() > limits.context) {
        return Bad(absl::StrCat("prompt token_ids has ", ids.size(),
                                " tokens, more than the context of ", limits.context));
      }
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
          return Bad(absl::StrCat("prompt token_ids[", i, "] must be in [0, ", limits.vocab_size,
                                  "), got ", ids[i]));
        }
      }
      job.prompt.assign(ids.begin(), ids.end());
      break;
    }
    default:
      return Bad("prompt is required: set text or token_ids");
  }
  TC_CHECK_OK(CheckGenerationFields(r, limits, job));
  return job;
}

ModelChat PrepareModelChat(const std::string& model_name, const ModelChatTemplate& source) {
  ModelChat mc;
  mc.model = model_name;
  mc.has_template = source.source.has_value();
  mc.bos_token = source.bos_token;
  mc.eos_token = source.eos_token;
  for (const auto& [name, text] : source.named) {
    mc.named.emplace(name, chat::ChatTemplate::Parse(text));
  }
  if (mc.has_template) {
    absl::StatusOr<chat::ChatTemplate> parsed = chat::ChatTemplate::Parse(*source.source);
    if (parsed.ok()) {
      mc.parsed = *std::move(parsed);
    } else {
      mc.parse_error = parsed.status();
    }
  }
  return mc;
}

namespace {

using Json = nlohmann::ordered_json;

// `text` as JSON: INVALID_ARGUMENT naming `field` when it does not parse or nests deeper than
// the limit (the template's values are built recursively, so depth is bounded first).
absl::StatusOr<Json> ParseJsonField(const std::string& field, const std::string& text,
                                    const RequestLimits& limits) {
  int deepest = 0;
  const Json::parser_callback_t depth = [&](int d, Json::parse_event_t, Json&) {
    deepest = std::max(deepest, d);
    return d <= limits.max_json_depth;  // deeper values are dropped, then refused below
  };
  Json j;
  try {
    j = Json::parse(text, depth);
  } catch (const Json::exception& e) {
    return Bad(absl::StrCat(field, " is not valid JSON: ", e.what()));
  }
  if (deepest > limits.max_json_depth) {
    return Bad(absl::StrCat(field, " nests deeper than ", limits.max_json_depth, " levels"));
  }
  return j;
}

// A string field of a chat message, checked and counted against the request's byte budget.
absl::Status CheckChatString(const std::string& field, const std::string& s, size_t* total) {
  if (!IsValidUtf8(s)) return Bad(absl::StrCat(field, " must be valid UTF-8"));
  *total += s.size();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Job> ValidateChat(const v1::ChatRequest& r, const RequestLimits& limits,
                                 const Tokenizer& tokenizer, const ModelChat& model_chat) {
  if (r.messages_size() == 0) return Bad("messages must hold at least one message");
  if (r.messages_size() > limits.max_chat_messages) {
    return Bad(absl::StrCat("messages must hold at most ", limits.max_chat_messages,
                            " messages, got ", r.messages_size()));
  }
  size_t total = 0;
  chat::ChatTemplateInputs in;
  for (int i = 0; i < r.messages_size(); ++i) {
    const v1::ChatMessage& m = r.messages(i);
    const std::string at = absl::StrCat("messages[", i, "]");
    static constexpr const char* kRoles[] = {"system", "user", "assistant", "tool"};
    if (std::find(std::begin(kRoles), std::end(kRoles), m.role()) == std::end(kRoles)) {
      // Escaped and cut short: it may be anything, and it goes into the log line.
      return Bad(absl::StrCat(at, ".role must be system, user, assistant or tool, got \"",
                              absl::CHexEscape(m.role().substr(0, 32)),
                              m.role().size() > 32 ? "...\"" : "\""));
    }
    Json msg = Json::object();
    msg["role"] = m.role();
    if (m.has_content()) {
      TC_CHECK_OK(CheckChatString(at + ".content", m.content(), &total));
      msg["content"] = m.content();
    } else {
      msg["content"] = nullptr;
    }
    if (m.has_name()) {
      TC_CHECK_OK(CheckChatString(at + ".name", m.name(), &total));
      msg["name"] = m.name();
    }
    if (m.has_tool_call_id()) {
      TC_CHECK_OK(CheckChatString(at + ".tool_call_id", m.tool_call_id(), &total));
      msg["tool_call_id"] = m.tool_call_id();
    }
    if (!m.tool_calls().empty()) {
      TC_CHECK_OK(CheckChatString(at + ".tool_calls", m.tool_calls(), &total));
      if (total > static_cast<size_t>(limits.max_prompt_bytes)) break;  // refused below
      absl::StatusOr<Json> calls = ParseJsonField(at + ".tool_calls", m.tool_calls(), limits);
      if (!calls.ok()) return calls.status();
      if (!calls->is_array()) return Bad(at + ".tool_calls must be a JSON array");
      msg["tool_calls"] = *std::move(calls);
    }
    in.messages.push_back(std::move(msg));
  }
  if (!r.tools().empty()) TC_CHECK_OK(CheckChatString("tools", r.tools(), &total));
  if (!r.template_kwargs().empty()) {
    TC_CHECK_OK(CheckChatString("template_kwargs", r.template_kwargs(), &total));
  }
  if (total > static_cast<size_t>(limits.max_prompt_bytes)) {
    return Bad(absl::StrCat("the conversation (messages, tools and template_kwargs) must be at "
                            "most ",
                            limits.max_prompt_bytes, " bytes, got ", total, " or more"));
  }
  if (!r.tools().empty()) {
    absl::StatusOr<Json> tools = ParseJsonField("tools", r.tools(), limits);
    if (!tools.ok()) return tools.status();
    if (!tools->is_array()) return Bad("tools must be a JSON array");
    in.tools = *std::move(tools);
  }
  if (!r.template_kwargs().empty()) {
    absl::StatusOr<Json> kwargs = ParseJsonField("template_kwargs", r.template_kwargs(), limits);
    if (!kwargs.ok()) return kwargs.status();
    if (!kwargs->is_object()) return Bad("template_kwargs must be a JSON object");
    in.extra = *std::move(kwargs);
  }
  in.add_generation_prompt = !r.has_add_generation_prompt() || r.add_generation_prompt();
  in.bos_token = model_chat.bos_token;
  in.eos_token = model_chat.eos_token;

  // The template: the request's, else the model's named one, else the model's.
  std::optional<chat::ChatTemplate> own;
  const chat::ChatTemplate* tmpl = nullptr;
  if (r.has_chat_template() && !r.chat_template_name().empty()) {
    return Bad("give chat_template or chat_template_name, not both");
  }
  if (!r.chat_template_name().empty()) {
    auto it = model_chat.named.find(r.chat_template_name());
    if (it == model_chat.named.end()) {
      std::vector<std::string> names;
      for (const auto& [name, t] : model_chat.named) names.push_back(name);
      return UnknownChatTemplateName("chat_template_name", r.chat_template_name(),
                                     model_chat.model, names);
    }
    if (!it->second.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the chat template '", it->first, "' of model ", model_chat.model,
          " does not parse: ", it->second.status().message()));
    }
    tmpl = &*it->second;
  } else if (r.has_chat_template()) {
    const std::string& source = r.chat_template();
    if (source.size() > static_cast<size_t>(limits.max_chat_template_bytes)) {
      return Bad(absl::StrCat("chat_template must be at most ", limits.max_chat_template_bytes,
                              " bytes, got ", source.size()));
    }
    if (!IsValidUtf8(source)) return Bad("chat_template must be valid UTF-8");
    absl::StatusOr<chat::ChatTemplate> parsed = chat::ChatTemplate::Parse(source);
    if (!parsed.ok()) return Bad(absl::StrCat("chat_template: ", parsed.status().message()));
    own = *std::move(parsed);
    tmpl = &*own;
  } else if (model_chat.parsed.has_value()) {
    tmpl = &*model_chat.parsed;
  } else if (model_chat.has_template) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the chat template of model ", model_chat.model,
        " does not parse (pass chat_template in the request): ", model_chat.parse_error.message()));
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", model_chat.model,
                     " has no chat template (tokenizer.chat_template); pass chat_template in "
                     "the request"));
  }
  absl::StatusOr<std::string> prompt = tmpl->Render(in, limits.render);
  if (!prompt.ok()) {
    // The template's own raise_exception (FAILED_PRECONDITION from the renderer) is also the
    // request's fault: its conversation is one the template refuses.
    return Bad(std::string(prompt.status().message()));
  }
  if (prompt->empty()) return Bad("the chat template rendered an empty prompt");

  Job job;
  job.prompt = EncodeChatPrompt(tokenizer, *prompt);
  if (job.prompt.empty()) return Bad("the rendered prompt has no tokens");
  TC_CHECK_OK(CheckGenerationFields(r, limits, job));
  if (!job.ignore_eos) {
    for (int32_t id : tokenizer.eog_ids()) {
      if (std::find(job.stop_token_ids.begin(), job.stop_token_ids.end(), id) ==
          job.stop_token_ids.end()) {
        job.stop_token_ids.push_back(id);
      }
    }
  }
  return job;
}

absl::Status ValidateTokenize(const v1::TokenizeRequest& r, const RequestLimits& limits) {
  if (r.text().size() > static_cast<size_t>(limits.max_prompt_bytes)) {
    return Bad(absl::StrCat("text must be at most ", limits.max_prompt_bytes, " bytes, got ",
                            r.text().size()));
  }
  if (!IsValidUtf8(r.text())) return Bad("text must be valid UTF-8");
  return absl::OkStatus();
}

absl::Status ValidateDetokenize(const v1::DetokenizeRequest& r, const RequestLimits& limits) {
  if (r.token_ids_size() > limits.context) {
    return Bad(absl::StrCat("token_ids must hold at most ", limits.context, " ids, got ",
                            r.token_ids_size()));
  }
  for (int i = 0; i < r.token_ids_size(); ++i) {
    const int32_t id = r.token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Bad(absl::StrCat("token_ids[", i, "] must be in [0, ", limits.vocab_size,
                              "), got ", id));
    }
  }
  return absl::OkStatus();
}

}  // namespace thermocline::gateway
