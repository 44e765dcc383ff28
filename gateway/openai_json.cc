#include "gateway/openai_json.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace thermocline::gateway {
namespace {

// Choices one request may ask for: each is a sequence of its own (a KV slot, a place in the
// batch), so a large n is a denial of service by one caller.
constexpr int64_t kMaxChoices = 16;

// Reads the fields of one JSON object, remembering the first error. A field that is absent or
// null is unset (OpenAI's clients send null for "not given").
class Fields {
 public:
  Fields(const OpenAiJson& obj, std::string prefix, ApiError* error)
      : obj_(obj), prefix_(std::move(prefix)), error_(error) {}

  bool ok() const { return ok_; }
  std::string Name(const char* name) const { return prefix_ + name; }

  // Records the first error; always false.
  bool Bad(const std::string& param, const std::string& message,
           const std::string& code = "invalid_type") {
    if (ok_) {
      error_->http_status = 400;
      error_->param = param;
      error_->message = message;
      error_->code = code;
    }
    ok_ = false;
    return false;
  }

  const OpenAiJson* Raw(const char* name) const {
    auto it = obj_.find(name);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<bool> Bool(const char* name) {
    const OpenAiJson* v = Raw(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return WrongType<bool>(name, "a boolean", *v);
    return v->get<bool>();
  }

  std::optional<double> Number(const char* name) {
    const OpenAiJson* v = Raw(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return WrongType<double>(name, "a number", *v);
    return v->get<double>();
  }

  // An integer in [lo, hi] (the proto field's range; validate.cc then checks the real limits).
  std::optional<int64_t> Int(const char* name, int64_t lo, int64_t hi) {
    const OpenAiJson* v = Raw(name);
    if (v == nullptr) return std::nullopt;
    return IntOf(*v, Name(name), lo, hi);
  }

  std::optional<int64_t> IntOf(const OpenAiJson& v, const std::string& param, int64_t lo,
                               int64_t hi) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(hi)) return OutOfRange(param, lo, hi);
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if (i < lo || i > hi) return OutOfRange(param, lo, hi);
      return i;
    }
    Bad(param, absl::StrCat(param, " must be an integer, got ", Describe(v)));
    return std::nullopt;
  }

  std::optional<std::string> String(const char* name) {
    const OpenAiJson* v = Raw(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return WrongType<std::string>(name, "a string", *v);
    return v->get<std::string>();
  }

  const OpenAiJson* Array(const char* name) {
    const OpenAiJson* v = Raw(name);
    if (v != nullptr && !v->is_array()) return WrongType<const OpenAiJson*>(name, "an array", *v).value_or(nullptr);
    return v;
  }

  const OpenAiJson* Object(const char* name) {
    const OpenAiJson* v = Raw(name);
    if (v != nullptr && !v->is_object()) return WrongType<const OpenAiJson*>(name, "an object", *v).value_or(nullptr);
    return v;
  }

  // "a string", "the number 3.5": what was sent, short (never the whole value).
  static std::string Describe(const OpenAiJson& v) {
    if (v.is_number()) return absl::StrCat("the number ", v.dump());
    if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
    return absl::StrCat("a", v.is_array() || v.is_object() ? "n " : " ", v.type_name());
  }

 private:
  template <class T>
  std::optional<T> WrongType(const char* name, const char* want, const OpenAiJson& got) {
    Bad(Name(name), absl::StrCat(Name(name), " must be ", want, ", got ", Describe(got)));
    return std::nullopt;
  }
  std::optional<int64_t> OutOfRange(const std::string& param, int64_t lo, int64_t hi) {
    Bad(param, absl::StrCat(param, " must be an integer in [", lo, ", ", hi, "]"),
        "invalid_value");
    return std::nullopt;
  }

  const OpenAiJson& obj_;
  std::string prefix_;
  ApiError* error_;
  bool ok_ = true;
};

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Structured output: `grammar` (GBNF, llama.cpp's server field) and `response_format`
// (json_object: any JSON object; json_schema: {"name", "schema", "strict"} as OpenAI sends it,
// always enforced) into the request's grammar / json_schema, which validate.cc compiles.
template <class Request>
void ReadStructuredOutput(Fields& f, Request* r) {
  if (auto g = f.String("grammar")) r->set_grammar(*g);
  const OpenAiJson* rf = f.Object("response_format");
  if (rf == nullptr) return;
  auto type = rf->find("type");
  if (type == rf->end() || !type->is_string()) {
    f.Bad("response_format.type", "response_format.type must be a string");
  } else if (*type == "json_object") {
    r->set_json_schema(R"({"type":"object"})");
  } else if (*type == "json_schema") {
    auto js = rf->find("json_schema");
    if (js == rf->end() || !js->is_object()) {
      f.Bad("response_format.json_schema",
            "response_format.json_schema must be an object {\"name\", \"schema\", \"strict\"}");
      return;
    }
    // name and strict are type-checked only: the schema is what counts, always enforced.
    auto name = js->find("name");
    if (name != js->end() && !name->is_null() && !name->is_string()) {
      f.Bad("response_format.json_schema.name",
            absl::StrCat("response_format.json_schema.name must be a string, got ",
                         Fields::Describe(*name)));
      return;
    }
    auto strict = js->find("strict");
    if (strict != js->end() && !strict->is_null() && !strict->is_boolean()) {
      f.Bad("response_format.json_schema.strict",
            absl::StrCat("response_format.json_schema.strict must be a boolean, got ",
                         Fields::Describe(*strict)));
      return;
    }
    auto schema = js->find("schema");
    if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
      f.Bad("response_format.json_schema.schema",
            "response_format.json_schema.schema must be a JSON schema (an object)", "missing");
      return;
    }
    r->set_json_schema(schema->dump());
  } else if (*type != "text") {
    f.Bad("response_format.type",
          absl::StrCat("response_format.type must be text, json_object or json_schema, got ",
                       type->dump()),
          "invalid_value");
  }
}

// Fields 3 to 17, which ChatRequest and GenerateRequest share, from the body.
template <class Request>
void ReadGenerationFields(Fields& f, bool chat, CompletionRequest* out, Request* r) {
  if (auto v = f.Int("max_completion_tokens", kInt32Min, kInt32Max)) {
    r->set_max_new_tokens(static_cast<int32_t>(*v));
    out->max_tokens_given = true;
    out->max_tokens_name = "max_completion_tokens";
  } else if (auto w = f.Int("max_tokens", kInt32Min, kInt32Max)) {
    r->set_max_new_tokens(static_cast<int32_t>(*w));
    out->max_tokens_given = true;
  }
  // OpenAI's defaults, which differ from thermocline generate's (0.8, 0.95, 40, 0.05).
  r->set_temperature(static_cast<float>(f.Number("temperature").value_or(1.0)));
  r->set_top_p(static_cast<float>(f.Number("top_p").value_or(1.0)));
  if (auto k = f.Int("top_k", -1, kInt32Max)) {
    r->set_top_k(*k == -1 ? 0 : static_cast<int32_t>(*k));  // vLLM's -1 = off
  } else {
    r->set_top_k(0);
  }
  r->set_min_p(static_cast<float>(f.Number("min_p").value_or(0.0)));
  if (auto v = f.Number("presence_penalty")) r->set_presence_penalty(static_cast<float>(*v));
  if (auto v = f.Number("frequency_penalty")) r->set_frequency_penalty(static_cast<float>(*v));
  if (auto v = f.Number("repetition_penalty")) r->set_repetition_penalty(static_cast<float>(*v));
  if (const OpenAiJson* seed = f.Raw("seed")) {
    // OpenAI's seed is a signed 64-bit integer; a negative one is used as its two's complement.
    if (seed->is_number_unsigned()) {
      r->set_seed(seed->get<uint64_t>());
    } else if (seed->is_number_integer()) {
      r->set_seed(static_cast<uint64_t>(seed->get<int64_t>()));
    } else {
      f.Bad("seed", absl::StrCat("seed must be an integer, got ", Fields::Describe(*seed)));
    }
  }
  if (const OpenAiJson* stop = f.Raw("stop")) {
    if (stop->is_string()) {
      r->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) {
          const std::string at = absl::StrCat("stop[", i, "]");
          f.Bad(at, absl::StrCat(at, " must be a string, got ", Fields::Describe((*stop)[i])));
          break;
        }
        r->add_stop((*stop)[i].get<std::string>());
      }
    } else {
      f.Bad("stop", absl::StrCat("stop must be a string or an array of strings, got ",
                                 Fields::Describe(*stop)));
    }
  }
  if (const OpenAiJson* ids = f.Array("stop_token_ids")) {  // vLLM's extension
    for (size_t i = 0; i < ids->size() && f.ok(); ++i) {
      if (auto id = f.IntOf((*ids)[i], absl::StrCat("stop_token_ids[", i, "]"), kInt32Min,
                            kInt32Max)) {
        r->add_stop_token_ids(static_cast<int32_t>(*id));
      }
    }
  }
  if (auto v = f.Bool("ignore_eos")) r->set_ignore_eos(*v);  // vLLM's extension
  if (chat) {
    if (auto v = f.Bool("logprobs")) r->set_logprobs(*v);
    if (auto v = f.Int("top_logprobs", kInt32Min, kInt32Max)) {
      r->set_top_logprobs(static_cast<int32_t>(*v));
    }
  } else if (auto v = f.Int("logprobs", kInt32Min, kInt32Max)) {
    // Completions: logprobs = N asks for the chosen token's and N alternatives.
    if (*v < 0) {
      f.Bad("logprobs", absl::StrCat("logprobs must be >= 0, got ", *v), "invalid_value");
    } else {
      r->set_logprobs(true);
      r->set_top_logprobs(static_cast<int32_t>(*v));
    }
  }
  ReadStructuredOutput(f, r);
}

// A chat message's content: a string, null, or an array of {"type": "text", "text": ...}
// parts (joined with newlines, as vLLM does).
void ReadContent(Fields& f, const OpenAiJson& content, const std::string& at,
                 v1::ChatMessage* m) {
  if (content.is_string()) {
    m->set_content(content.get<std::string>());
    return;
  }
  if (!content.is_array()) {
    f.Bad(at, absl::StrCat(at, " must be a string, an array of text parts or null, got ",
                           Fields::Describe(content)));
    return;
  }
  std::vector<std::string> texts;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string part_at = absl::StrCat(at, "[", j, "]");
    const OpenAiJson& part = content[j];
    if (!part.is_object()) {
      f.Bad(part_at, absl::StrCat(part_at, " must be an object, got ", Fields::Describe(part)));
      return;
    }
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      f.Bad(part_at + ".type", absl::StrCat(part_at, ".type must be a string"));
      return;
    }
    if (*type != "text") {
      f.Bad(part_at + ".type",
            absl::StrCat(part_at, ".type ", type->dump(),
                         " is not supported (the model reads text parts only)"),
            "unsupported");
      return;
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      f.Bad(part_at + ".text", absl::StrCat(part_at, ".text must be a string"));
      return;
    }
    texts.push_back(text->get<std::string>());
  }
  m->set_content(absl::StrJoin(texts, "\n"));
}

void ReadMessages(Fields& f, v1::ChatRequest* r) {
  const OpenAiJson* messages = f.Array("messages");
  if (!f.ok()) return;
  if (messages == nullptr) {
    f.Bad("messages", "messages is required (an array of chat messages)", "missing");
    return;
  }
  for (size_t i = 0; i < messages->size() && f.ok(); ++i) {
    const std::string at = absl::StrCat("messages[", i, "]");
    const OpenAiJson& msg = (*messages)[i];
    if (!msg.is_object()) {
      f.Bad(at, absl::StrCat(at, " must be an object, got ", Fields::Describe(msg)));
      return;
    }
    // Only read through: its errors go to `f`, which names the whole path.
    Fields mf(msg, at + ".", nullptr);
    v1::ChatMessage* m = r->add_messages();
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) {
      f.Bad(at + ".role", absl::StrCat(at, ".role must be a string"), "missing");
      return;
    }
    m->set_role(role->get<std::string>());
    if (const OpenAiJson* content = mf.Raw("content")) ReadContent(f, *content, at + ".content", m);
    for (const char* key : {"name", "tool_call_id"}) {
      const OpenAiJson* v = mf.Raw(key);
      if (v == nullptr) continue;
      if (!v->is_string()) {
        f.Bad(at + "." + key, absl::StrCat(at, ".", key, " must be a string, got ",
                                           Fields::Describe(*v)));
        return;
      }
      if (std::string(key) == "name") {
        m->set_name(v->get<std::string>());
      } else {
        m->set_tool_call_id(v->get<std::string>());
      }
    }
    if (const OpenAiJson* calls = mf.Raw("tool_calls")) {
      if (!calls->is_array()) {
        f.Bad(at + ".tool_calls", absl::StrCat(at, ".tool_calls must be an array, got ",
                                               Fields::Describe(*calls)));
        return;
      }
      m->set_tool_calls(calls->dump());
    }
  }
}

void ReadPrompt(Fields& f, v1::GenerateRequest* r) {
  const OpenAiJson* prompt = f.Raw("prompt");
  if (prompt == nullptr) {
    f.Bad("prompt", "prompt is required (a string or an array of token ids)", "missing");
    return;
  }
  if (prompt->is_string()) {
    r->set_text(prompt->get<std::string>());
    return;
  }
  const char* kShape = "prompt must be a string, an array of token ids, or an array holding one "
                       "of those";
  if (!prompt->is_array()) {
    f.Bad("prompt", absl::StrCat(kShape, "; got ", Fields::Describe(*prompt)));
    return;
  }
  const OpenAiJson* ids = prompt;
  if (!prompt->empty() && !(*prompt)[0].is_number()) {
    // A batch of prompts (OpenAI's array of strings or of token arrays).
    if (prompt->size() > 1) {
      f.Bad("prompt",
            absl::StrCat("prompt holds ", prompt->size(),
                         " prompts; a batch is not supported yet (send one request per prompt)"),
            "unsupported");
      return;
    }
    const OpenAiJson& one = (*prompt)[0];
    if (one.is_string()) {
      r->set_text(one.get<std::string>());
      return;
    }
    if (!one.is_array()) {
      f.Bad("prompt", absl::StrCat(kShape, "; got prompt[0] ", Fields::Describe(one)));
      return;
    }
    ids = &one;
  }
  v1::TokenIds* out = r->mutable_token_ids();
  for (size_t i = 0; i < ids->size() && f.ok(); ++i) {
    if (auto id = f.IntOf((*ids)[i], absl::StrCat("prompt[", i, "]"), kInt32Min, kInt32Max)) {
      out->add_ids(static_cast<int32_t>(*id));
    }
  }
}

// Fields whose meaning the gateway cannot honour yet: refused by name rather than ignored,
// since ignoring them would return something else than what was asked.
void RefuseUnsupported(Fields& f, bool chat) {
  if (const OpenAiJson* bias = f.Object("logit_bias"); bias != nullptr && !bias->empty()) {
    f.Bad("logit_bias", "logit_bias is not supported yet", "unsupported");
  }
  if (!chat) {
    if (f.Bool("echo").value_or(false)) {
      f.Bad("echo", "echo is not supported yet", "unsupported");
    }
    if (f.Int("best_of", 1, kMaxChoices).value_or(1) > 1) {
      f.Bad("best_of", "best_of > 1 is not supported yet", "unsupported");
    }
    if (!f.String("suffix").value_or("").empty()) {
      f.Bad("suffix", "suffix is not supported yet", "unsupported");
    }
  }
}

}  // namespace

OpenAiJson ErrorBody(const ApiError& e) {
  static constexpr std::pair<int, const char*> kTypes[] = {
      {400, "invalid_request_error"}, {401, "authentication_error"},
      {404, "not_found_error"},       {413, "invalid_request_error"},
      {429, "rate_limit_error"},
      {503, "service_unavailable"},   {504, "timeout"}};
  const char* type = "server_error";
  for (const auto& [status, name] : kTypes) {
    if (status == e.http_status) type = name;
  }
  OpenAiJson err = OpenAiJson::object();
  err["message"] = e.message;
  err["type"] = type;
  err["param"] = e.param.empty() ? OpenAiJson(nullptr) : OpenAiJson(e.param);
  err["code"] = e.code.empty() ? OpenAiJson(nullptr) : OpenAiJson(e.code);
  return OpenAiJson{{"error", std::move(err)}};
}

ApiError FromStatus(const absl::Status& status, const std::string& max_tokens_name) {
  ApiError e;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition: e.http_status = 400; break;
    case absl::StatusCode::kUnauthenticated: e.http_status = 401; break;
    case absl::StatusCode::kNotFound: e.http_status = 404; break;
    case absl::StatusCode::kResourceExhausted: e.http_status = 429; break;
    case absl::StatusCode::kUnavailable: e.http_status = 503; break;
    case absl::StatusCode::kDeadlineExceeded: e.http_status = 504; break;
    default: e.http_status = 500; break;
  }
  std::string code = absl::StatusCodeToString(status.code());
  std::transform(code.begin(), code.end(), code.begin(),
                 [](unsigned char c) { return c == ' ' ? '_' : std::tolower(c); });
  e.code = code;
  // validate.cc's messages start with the proto field's name; the HTTP names differ in two.
  std::string message = absl::StrReplaceAll(
      status.message(), {{"max_new_tokens", max_tokens_name},
                         {"template_kwargs", "chat_template_kwargs"}});
  if (e.http_status == 400) {
    size_t n = 0;
    // The field's whole path: "messages[2].content", "stop[1]".
    while (n < message.size() && (std::isalnum(static_cast<unsigned char>(message[n])) ||
                                  message[n] == '_' || message[n] == '[' || message[n] == ']' ||
                                  message[n] == '.')) {
      ++n;
    }
    while (n > 0 && message[n - 1] == '.') --n;
    std::string lead = message.substr(0, n);
    if (lead == "prompt" && message.find(max_tokens_name) != std::string::npos) {
      lead = max_tokens_name;  // "prompt (N tokens) + max_tokens (M) exceeds the context"
    } else if (lead == "the") {
      lead = "messages";  // "the conversation ...", "the chat template rendered ..."
    } else if (lead == "json_schema") {
      // The proto's json_schema is response_format's here.
      lead = "response_format.json_schema";
      message = "response_format." + message;
    }
    e.param = lead;
  }
  e.message = std::move(message);
  return e;
}

bool ParseBody(const std::string& body, int max_depth, OpenAiJson* out, ApiError* error) {
  int deepest = 0;
  const OpenAiJson::parser_callback_t depth = [&](int d, OpenAiJson::parse_event_t,
                                                  OpenAiJson&) {
    deepest = std::max(deepest, d);
    return d <= max_depth;  // deeper values are dropped, then refused below
  };
  error->http_status = 400;
  error->code = "invalid_json";
  try {
    *out = OpenAiJson::parse(body, depth);
  } catch (const OpenAiJson::exception& e) {
    error->message = absl::StrCat("the request body is not valid JSON: ", e.what());
    return false;
  }
  if (deepest > max_depth) {
    error->message = absl::StrCat("the request body nests deeper than ", max_depth, " levels");
    return false;
  }
  if (!out->is_object()) {
    error->message = absl::StrCat("the request body must be a JSON object, got ",
                                  Fields::Describe(*out));
    return false;
  }
  error->code.clear();
  return true;
}

bool ParseCompletionRequest(const OpenAiJson& body, bool chat, CompletionRequest* out,
                            ApiError* error) {
  Fields f(body, "", error);
  out->chat = chat;
  out->model = f.String("model").value_or("");
  out->stream = f.Bool("stream").value_or(false);
  if (const OpenAiJson* so = f.Object("stream_options")) {
    Fields sf(*so, "stream_options.", error);
    out->include_usage = sf.Bool("include_usage").value_or(false);
    if (!sf.ok()) return false;
  }
  out->n = static_cast<int32_t>(f.Int("n", kInt32Min, kInt32Max).value_or(1));
  if (f.ok() && out->n < 1) f.Bad("n", absl::StrCat("n must be >= 1, got ", out->n), "invalid_value");
  if (f.ok() && out->n > kMaxChoices) {
    f.Bad("n", absl::StrCat("n must be at most ", kMaxChoices, ", got ", out->n),
          "invalid_value");
  }
  (void)f.String("user");  // accepted (type-checked) and not used
  RefuseUnsupported(f, chat);
  if (chat) {
    v1::ChatRequest* r = &out->chat_request;
    ReadMessages(f, r);
    if (const OpenAiJson* tools = f.Array("tools")) r->set_tools(tools->dump());
    // vLLM's extensions: a template, its variables, and add_generation_prompt.
    if (auto t = f.String("chat_template")) r->set_chat_template(*t);
    if (const OpenAiJson* kw = f.Object("chat_template_kwargs")) r->set_template_kwargs(kw->dump());
    if (auto g = f.Bool("add_generation_prompt")) r->set_add_generation_prompt(*g);
    ReadGenerationFields(f, true, out, r);
  } else {
    ReadPrompt(f, &out->generate_request);
    ReadGenerationFields(f, false, out, &out->generate_request);
  }
  return f.ok();
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_CANCELLED: return "abort";
    default: return "stop";
  }
}

namespace {

OpenAiJson Bytes(const std::string& s) {
  OpenAiJson b = OpenAiJson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// A logprob as JSON: -inf (a token the model rules out) has no JSON number; OpenAI's clients
// get -9999, as vLLM sends.
OpenAiJson LogprobValue(float lp) { return std::isfinite(lp) ? lp : -9999.0f; }

}  // namespace

OpenAiJson ChatLogprobs(const std::vector<v1::TokenLogprob>& lps, const Tokenizer& tokenizer) {
  OpenAiJson content = OpenAiJson::array();
  for (const v1::TokenLogprob& lp : lps) {
    const int32_t id = lp.token_id();
    const std::string text = tokenizer.Decode(std::span<const int32_t>(&id, 1));
    OpenAiJson top = OpenAiJson::array();
    for (const v1::TopLogprob& t : lp.top()) {
      top.push_back({{"token", t.text()}, {"logprob", LogprobValue(t.logprob())},
                     {"bytes", Bytes(t.text())}});
    }
    content.push_back({{"token", text}, {"logprob", LogprobValue(lp.logprob())},
                       {"bytes", Bytes(text)}, {"top_logprobs", std::move(top)}});
  }
  return OpenAiJson{{"content", std::move(content)}, {"refusal", nullptr}};
}

OpenAiJson CompletionLogprobs(const std::vector<v1::TokenLogprob>& lps,
                              const Tokenizer& tokenizer, int64_t offset) {
  OpenAiJson tokens = OpenAiJson::array(), values = OpenAiJson::array(),
             tops = OpenAiJson::array(), offsets = OpenAiJson::array();
  for (const v1::TokenLogprob& lp : lps) {
    const int32_t id = lp.token_id();
    const std::string text = tokenizer.Decode(std::span<const int32_t>(&id, 1));
    tokens.push_back(text);
    values.push_back(LogprobValue(lp.logprob()));
    OpenAiJson top = OpenAiJson::object();
    for (const v1::TopLogprob& t : lp.top()) top[t.text()] = LogprobValue(t.logprob());
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(text.size());
  }
  return OpenAiJson{{"tokens", std::move(tokens)},
                    {"token_logprobs", std::move(values)},
                    {"top_logprobs", std::move(tops)},
                    {"text_offset", std::move(offsets)}};
}

OpenAiJson UsageJson(int64_t prompt_tokens, int64_t completion_tokens) {
  return OpenAiJson{{"prompt_tokens", prompt_tokens},
                    {"completion_tokens", completion_tokens},
                    {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace thermocline::gateway
