// The Chat call of a real thermocline-gateway over real gRPC: a conversation rendered through a
// template (the request's or the model's) and streamed equals Generate on the token ids that
// the test renders (shared/chat) and tokenizes itself; the errors (no template, a template
// that fails or raises, bad JSON, bad roles) name what is wrong; Tokenize's parse_special and
// GetModelInfo's tokenizer fields on models whose vocabularies have control tokens
// (synth --tokenizer-from); a model's named templates (tokenizer.chat_template.NAME); and
// `thermocline chat --server` over a pipe.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "shared/chat/chat_template.h"
#include "shared/gguf/gguf.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/e2e/gateway_harness.h"

namespace thermocline::testing {
namespace {

using Json = nlohmann::ordered_json;

std::string Unique(const std::string& name) { return absl::StrCat("e2e-chat-", name, "-", getpid()); }

// A plain template in the style of the published ones; it writes BOS itself.
constexpr char kTemplate[] =
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

struct Msg {
  std::string role, content;
};

v1::ChatRequest ChatOf(const std::vector<Msg>& msgs, int n) {
  v1::ChatRequest r;
  for (const Msg& m : msgs) {
    v1::ChatMessage* cm = r.add_messages();
    cm->set_role(m.role);
    cm->set_content(m.content);
  }
  r.set_max_new_tokens(n);
  r.set_temperature(0);
  return r;
}

Json JsonOf(const std::vector<Msg>& msgs) {
  Json j = Json::array();
  for (const Msg& m : msgs) j.push_back({{"role", m.role}, {"content", m.content}});
  return j;
}

// The prompt the test expects: rendered here by shared/chat with the vocabulary's BOS/EOS
// texts, tokenized with special tokens parsed. A template that writes the BOS text itself gets
// no second BOS; one that does not gets the vocabulary's (add_special).
std::vector<int32_t> ExpectedPrompt(const Tokenizer& tok, const std::string& source,
                                    const std::vector<Msg>& msgs, bool add_generation_prompt,
                                    const Json& extra = Json::object()) {
  chat::ChatTemplateInputs in;
  in.messages = JsonOf(msgs);
  in.add_generation_prompt = add_generation_prompt;
  in.bos_token = tok.piece(tok.bos());
  in.eos_token = tok.piece(tok.eos());
  in.extra = extra;
  absl::StatusOr<std::string> text = chat::RenderChatTemplate(source, in);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return {};
  const bool writes_bos = text->rfind(tok.piece(tok.bos()), 0) == 0;
  return tok.Encode(*text, EncodeOptions{.add_special = !writes_bos, .parse_special = true});
}

// Generate on `ids`, greedy, with every EOG id as a stop token (what Chat stops at).
Completion GenerateOnIds(Gateway& gw, const Tokenizer& tok, const std::vector<int32_t>& ids,
                         int n) {
  v1::GenerateRequest r = Greedy("", n);
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  for (int32_t id : tok.eog_ids()) r.add_stop_token_ids(id);
  return gw.Generate(r);
}

void ExpectSameStream(const Completion& chat, const Completion& gen, size_t n_prompt) {
  ASSERT_TRUE(chat.status.ok()) << chat.status.error_message();
  ASSERT_TRUE(gen.status.ok()) << gen.status.error_message();
  EXPECT_FALSE(chat.ids.empty());
  EXPECT_EQ(chat.ids, gen.ids);
  EXPECT_EQ(chat.text, gen.text);
  EXPECT_EQ(chat.chunks, gen.chunks);
  EXPECT_EQ(chat.final.usage().prompt_tokens(), static_cast<int>(n_prompt));
  EXPECT_EQ(chat.final.usage().prompt_tokens(), gen.final.usage().prompt_tokens());
  EXPECT_EQ(chat.final.usage().completion_tokens(), gen.final.usage().completion_tokens());
  EXPECT_EQ(chat.final.finish_reason(), gen.final.finish_reason());
  EXPECT_EQ(chat.final.matched_stop_token(), gen.final.matched_stop_token());
}

TEST(GatewayChat, StreamEqualsGenerateOnTheRenderedPrompt) {
  Gateway gw(Unique("stream"));
  auto tok = Tokenizer::Load(Stories260K());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<Msg> convo = {{"system", "You tell stories."},
                                  {"user", "Once upon a time"},
                                  {"assistant", "there was a little dog."},
                                  {"user", "What did the dog do?"}};
  {
    SCOPED_TRACE("template that writes BOS; add_generation_prompt unset (true)");
    v1::ChatRequest req = ChatOf(convo, 32);
    req.set_chat_template(kTemplate);
    const std::vector<int32_t> want = ExpectedPrompt(*tok, kTemplate, convo, true);
    ASSERT_GT(want.size(), 2u);
    EXPECT_EQ(want[0], tok->bos());  // exactly one BOS
    EXPECT_NE(want[1], tok->bos());
    ExpectSameStream(gw.Chat(req), GenerateOnIds(gw, *tok, want, 32), want.size());
  }
  {
    SCOPED_TRACE("template without BOS, add_generation_prompt false, kwargs");
    const std::string source =
        "{{ greeting }}{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}";
    v1::ChatRequest req = ChatOf(convo, 24);
    req.set_chat_template(source);
    req.set_add_generation_prompt(false);
    req.set_template_kwargs(R"({"greeting": "Lily and Tom."})");
    const std::vector<int32_t> want =
        ExpectedPrompt(*tok, source, convo, false, Json::parse(R"({"greeting": "Lily and Tom."})"));
    ASSERT_GT(want.size(), 2u);
    EXPECT_EQ(want[0], tok->bos());  // the vocabulary adds it
    EXPECT_NE(want, ExpectedPrompt(*tok, source, convo, true, Json::parse(R"({"greeting": "Lily and Tom."})")));
    ExpectSameStream(gw.Chat(req), GenerateOnIds(gw, *tok, want, 24), want.size());
  }
}

TEST(GatewayChat, ErrorsNameTheProblem) {
  Gateway gw(Unique("errors"));
  using grpc::StatusCode;
  struct Case {
    std::string what;
    std::function<void(v1::ChatRequest&)> edit;
    StatusCode code;
    std::string names;  // a substring the message must hold
  };
  std::string deep(100, '[');
  deep += std::string(100, ']');
  const std::vector<Case> cases = {
      {"no template anywhere", [](auto& r) { r.clear_chat_template(); },
       StatusCode::FAILED_PRECONDITION, "model stories260K.gguf has no chat template"},
      {"raise_exception", [](auto& r) {
         r.set_chat_template("{% if messages[0].role != 'system' %}"
                             "{{ raise_exception('Conversations must open with a system turn') }}"
                             "{% endif %}{{ messages[0].content }}");
       }, StatusCode::INVALID_ARGUMENT, "Conversations must open with a system turn"},
      {"template syntax error", [](auto& r) { r.set_chat_template("{% for m in messages %}"); },
       StatusCode::INVALID_ARGUMENT, "chat_template"},
      {"template renders nothing", [](auto& r) { r.set_chat_template("{# nothing #}"); },
       StatusCode::INVALID_ARGUMENT, "empty prompt"},
      {"rendering past the gateway's 1 MiB output limit", [](auto& r) { r.set_chat_template("{{ 'x' * 1100000 }}"); },
       StatusCode::INVALID_ARGUMENT, "template output is longer than 1048576"},
      {"rendering past the step limit", [](auto& r) {
         r.set_chat_template("{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}x");
       }, StatusCode::INVALID_ARGUMENT, "steps"},
      {"kwargs not JSON", [](auto& r) { r.set_template_kwargs("{greeting: hi}"); },
       StatusCode::INVALID_ARGUMENT, "template_kwargs is not valid JSON"},
      {"kwargs not an object", [](auto& r) { r.set_template_kwargs("[1, 2]"); },
       StatusCode::INVALID_ARGUMENT, "template_kwargs must be a JSON object"},
      {"kwargs too deep", [deep](auto& r) { r.set_template_kwargs(absl::StrCat("{\"a\": ", deep, "}")); },
       StatusCode::INVALID_ARGUMENT, "template_kwargs nests deeper"},
      {"tools not JSON", [](auto& r) { r.set_tools("[{]"); },
       StatusCode::INVALID_ARGUMENT, "tools is not valid JSON"},
      {"tools not an array", [](auto& r) { r.set_tools("{}"); },
       StatusCode::INVALID_ARGUMENT, "tools must be a JSON array"},
      {"tool_calls not an array", [](auto& r) { r.mutable_messages(0)->set_tool_calls("{\"id\": 1}"); },
       StatusCode::INVALID_ARGUMENT, "messages[0].tool_calls must be a JSON array"},
      {"unknown role", [](auto& r) { r.mutable_messages(0)->set_role("wizard"); },
       StatusCode::INVALID_ARGUMENT, "messages[0].role must be system, user, assistant or tool, got \"wizard\""},
      {"no messages", [](auto& r) { r.clear_messages(); },
       StatusCode::INVALID_ARGUMENT, "messages must hold at least one"},
      {"too many messages", [](auto& r) { for (int i = 0; i < 1100; ++i) *r.add_messages() = r.messages(0); },
       StatusCode::INVALID_ARGUMENT, "messages must hold at most 1024"},
      {"conversation too big", [](auto& r) { r.mutable_messages(0)->set_content(std::string(70000, 'a')); },
       StatusCode::INVALID_ARGUMENT, "the conversation"},
      {"sampling fields are checked", [](auto& r) { r.set_temperature(-1); },
       StatusCode::INVALID_ARGUMENT, "temperature must be >= 0"},
      {"max_new_tokens", [](auto& r) { r.set_max_new_tokens(0); },
       StatusCode::INVALID_ARGUMENT, "max_new_tokens"},
      {"beyond the context", [](auto& r) { r.set_max_new_tokens(250); },
       StatusCode::INVALID_ARGUMENT, "exceeds the context"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::ChatRequest r = ChatOf({{"user", "Once upon a time"}}, 8);
    r.set_chat_template(kTemplate);
    c.edit(r);
    const Completion got = gw.Chat(r);
    EXPECT_EQ(got.status.error_code(), c.code) << got.status.error_message();
    EXPECT_NE(got.status.error_message().find(c.names), std::string::npos)
        << "message: " << got.status.error_message();
    EXPECT_TRUE(got.ids.empty());
  }
  // Tool calls, tools, names and content-less turns reach the template as JSON.
  v1::ChatRequest r = ChatOf({{"user", "Once upon a time"}}, 4);
  r.set_chat_template(
      "{{ tools[0].name }} {{ messages[1].tool_calls[0].function.name }} {{ messages[1].content "
      "is none }} {{ messages[2].tool_call_id }} {{ messages[0].name }}");
  r.mutable_messages(0)->set_name("lily");
  v1::ChatMessage* call = r.add_messages();
  call->set_role("assistant");
  call->set_tool_calls(R"([{"type": "function", "function": {"name": "story", "arguments": {}}}])");
  v1::ChatMessage* answer = r.add_messages();
  answer->set_role("tool");
  answer->set_tool_call_id("call-7");
  answer->set_content("a dog");
  r.set_tools(R"([{"name": "teller"}])");
  const Completion ok = gw.Chat(r);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  auto tok = Tokenizer::Load(Stories260K());
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> want = tok->Encode("teller story True call-7 lily",
                                                EncodeOptions{.add_special = true});
  EXPECT_EQ(ok.final.usage().prompt_tokens(), static_cast<int>(want.size()));
  EXPECT_EQ(ok.ids, GenerateOnIds(gw, *tok, want, 4).ids);
  EXPECT_EQ(gw.Health(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// A servable model with `vocab`'s tokenizer (synth --tokenizer-from).
std::string SynthWith(const std::string& vocab) {
  const std::string path = absl::StrCat(TempDir(), "/", vocab, "-synth.gguf");
  const CommandResult r = RunCommand(
      {absl::StrCat(BinDir(), "/thermocline"), "synth", "-o", path, "--tokenizer-from",
       absl::StrCat(SharedDataDir(), "/tokenizers/ggml-vocab-", vocab, ".gguf"), "--dim", "64",
       "--ffn", "128", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--context", "256"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return path;
}

v1::TokenizeResponse Tokenize(Gateway& gw, const std::string& text, bool parse_special) {
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text(text);
  req.set_parse_special(parse_special);
  v1::TokenizeResponse resp;
  const grpc::Status s = gw.stub().Tokenize(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

v1::ModelInfo InfoOf(Gateway& gw) {
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  const grpc::Status s = gw.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return info;
}

std::vector<int32_t> Ids(const v1::TokenizeResponse& r) {
  return {r.token_ids().begin(), r.token_ids().end()};
}

// Phi-3's vocabulary (SentencePiece, with control tokens and a chat template that writes BOS):
// parse_special, the model info, and Chat with the model's own template.
TEST(GatewayChat, ControlTokensModelInfoAndTheModelsOwnTemplate) {
  const std::string model = SynthWith("phi-3");
  Gateway gw(Unique("phi3"), {}, true, model);
  // <|user|> is control token 32010 in Phi-3's vocabulary (llama.cpp's test vectors).
  const v1::TokenizeResponse special = Tokenize(gw, "<|user|>\nHello<|end|>", true);
  const v1::TokenizeResponse plain = Tokenize(gw, "<|user|>\nHello<|end|>", false);
  ASSERT_GT(special.token_ids_size(), 0);
  EXPECT_EQ(special.token_ids(0), 32010);
  EXPECT_EQ(special.pieces(0), "<|user|>");
  EXPECT_EQ(special.token_ids(special.token_ids_size() - 1), 32007);
  EXPECT_GT(plain.token_ids_size(), special.token_ids_size() + 4);
  for (int32_t id : plain.token_ids()) EXPECT_LT(id, 32000) << "a special id without parse_special";

  const v1::ModelInfo info = InfoOf(gw);
  EXPECT_EQ(info.tokenizer_kind(), "spm");
  EXPECT_EQ(info.tokenizer_pre(), "");
  EXPECT_TRUE(info.has_chat_template());
  ASSERT_TRUE(info.has_bos_token());
  EXPECT_EQ(info.bos_token().id(), 1);
  EXPECT_EQ(info.bos_token().text(), "<s>");
  ASSERT_TRUE(info.has_eos_token());
  EXPECT_EQ(info.eos_token().id(), 32000);
  EXPECT_EQ(info.eos_token().text(), "<|endoftext|>");
  ASSERT_TRUE(info.has_eot_token());
  EXPECT_EQ(info.eot_token().text(), "<|end|>");
  EXPECT_FALSE(info.has_eom_token());
  std::vector<std::string> eog;
  for (const v1::SpecialToken& t : info.eog_tokens()) eog.push_back(t.text());
  EXPECT_NE(std::find(eog.begin(), eog.end(), "<|end|>"), eog.end());
  EXPECT_NE(std::find(eog.begin(), eog.end(), "<|endoftext|>"), eog.end());
  EXPECT_EQ(info.max_chat_messages(), 1024);

  // Chat with the model's template: its <|user|> ... <|end|> markers become their ids, its BOS
  // is the only one, and the stream is Generate's on those ids.
  auto tok = Tokenizer::Load(model);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto header = GgufFile::OpenHeader(model);
  ASSERT_TRUE(header.ok()) << header.status();
  const GgufValue* source = (*header)->FindValue("tokenizer.chat_template");
  ASSERT_TRUE(source != nullptr && source->AsString() != nullptr);
  const std::vector<Msg> convo = {{"user", "Hello"}, {"assistant", "Hi there."},
                                  {"user", "Tell me a story."}};
  const std::vector<int32_t> want = ExpectedPrompt(*tok, *source->AsString(), convo, true);
  ASSERT_GT(want.size(), 2u);
  EXPECT_EQ(want[0], 1);
  EXPECT_NE(want[1], 1);
  EXPECT_NE(std::find(want.begin(), want.end(), 32010), want.end());
  ExpectSameStream(gw.Chat(ChatOf(convo, 16)), GenerateOnIds(gw, *tok, want, 16), want.size());
}

// stories260K rewritten with a default template and a named one, tokenizer.chat_template.NAME.
std::string WithNamedTemplates(const std::string& named_source) {
  const std::string out = absl::StrCat(TempDir(), "/stories-named-templates.gguf");
  const absl::Status s = CopyGgufWithMetadata(
      ModelPath("stories260K/stories260K.gguf"),
      {{"tokenizer.chat_template", GgufString(kTemplate)},
       {"tokenizer.chat_template.tool_use", GgufString(named_source)}},
      out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// chat_template_name picks tokenizer.chat_template.NAME: the stream equals Generate on that
// template's rendering, not the default's; ModelInfo lists the names; an unknown name, or a
// name together with chat_template, is INVALID_ARGUMENT saying which names exist.
TEST(GatewayChat, NamedTemplateIsChosenByName) {
  constexpr char kNamed[] =
      "{% for m in messages %}<{{ m.role }}> {{ m.content }} {% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}";
  const std::string model = WithNamedTemplates(kNamed);
  Gateway gw(Unique("named"), {}, true, model);
  const v1::ModelInfo info = InfoOf(gw);
  ASSERT_EQ(info.chat_template_names_size(), 1);
  EXPECT_EQ(info.chat_template_names(0), "tool_use");
  auto tok = Tokenizer::Load(model);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<Msg> convo = {{"user", "Tell me a story about a cat."}};
  const std::vector<int32_t> named = ExpectedPrompt(*tok, kNamed, convo, true);
  const std::vector<int32_t> plain = ExpectedPrompt(*tok, kTemplate, convo, true);
  ASSERT_NE(named, plain);
  v1::ChatRequest r = ChatOf(convo, 12);
  r.set_chat_template_name("tool_use");
  ExpectSameStream(gw.Chat(r), GenerateOnIds(gw, *tok, named, 12), named.size());
  ExpectSameStream(gw.Chat(ChatOf(convo, 12)), GenerateOnIds(gw, *tok, plain, 12), plain.size());

  r.set_chat_template_name("rag");
  const Completion unknown = gw.Chat(r);
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(unknown.status.error_message().find("'rag'"), std::string::npos)
      << unknown.status.error_message();
  EXPECT_NE(unknown.status.error_message().find("has tool_use"), std::string::npos)
      << unknown.status.error_message();
  r.set_chat_template_name("tool_use");
  r.set_chat_template(kTemplate);
  const Completion both = gw.Chat(r);
  EXPECT_EQ(both.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(both.status.error_message().find("not both"), std::string::npos)
      << both.status.error_message();
}

// GPT-2's byte-level BPE: the kind and pre-tokenizer, and <|endoftext|> parsed only on request.
TEST(GatewayChat, BpeVocabularyKindAndSpecialTokens) {
  Gateway gw(Unique("gpt2"), {}, true, SynthWith("gpt-2"));
  const v1::ModelInfo info = InfoOf(gw);
  EXPECT_EQ(info.tokenizer_kind(), "bpe");
  EXPECT_EQ(info.tokenizer_pre(), "gpt-2");
  EXPECT_FALSE(info.has_chat_template());
  EXPECT_EQ(info.eos_token().id(), 50256);
  EXPECT_EQ(info.eos_token().text(), "<|endoftext|>");
  EXPECT_EQ(Ids(Tokenize(gw, "Hi<|endoftext|>", true)).back(), 50256);
  const std::vector<int32_t> plain = Ids(Tokenize(gw, "Hi<|endoftext|>", false));
  EXPECT_EQ(std::find(plain.begin(), plain.end(), 50256), plain.end());
  EXPECT_GT(plain.size(), 3u);
}

TEST(GatewayChat, StoriesModelInfoHasNoTemplate) {
  Gateway gw(Unique("info"));
  const v1::ModelInfo info = InfoOf(gw);
  EXPECT_EQ(info.tokenizer_kind(), "spm");
  EXPECT_FALSE(info.has_chat_template());
  EXPECT_EQ(info.bos_token().text(), "<s>");
  EXPECT_EQ(info.eos_token().text(), "</s>");
  EXPECT_FALSE(info.has_eot_token());
  ASSERT_EQ(info.eog_tokens_size(), 1);
  EXPECT_EQ(info.eog_tokens(0).id(), 2);
  // stories260K's <s> is a control token: parsed only with parse_special.
  EXPECT_EQ(Ids(Tokenize(gw, "<s>", true)), std::vector<int32_t>{1});
  EXPECT_NE(Ids(Tokenize(gw, "<s>", false)), std::vector<int32_t>{1});
}

// `thermocline chat --server` over a pipe: each line is a turn, each reply the text of the Chat
// call on the conversation so far.
TEST(GatewayChat, ChatCommandOverTheServer) {
  Gateway gw(Unique("command"));
  const std::string dir = TempDir();
  const std::string tmpl = dir + "/chat.jinja", input = dir + "/turns.txt";
  for (const auto& [path, text] : {std::pair<std::string, std::string>{tmpl, kTemplate},
                                   {input, "Once upon a time\nWhat did the dog do?\n/exit\nignored\n"}}) {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  const CommandResult r = RunCommand(
      {"/bin/sh", "-c",
       absl::StrCat(BinDir(), "/thermocline chat --server ", gw.address(), " --template ", tmpl,
                    " --system 'You tell stories.' -n 24 -t 0 < ", input)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<Msg> convo = {{"system", "You tell stories."}, {"user", "Once upon a time"}};
  std::string want;
  for (const char* next : {"What did the dog do?", ""}) {
    v1::ChatRequest req = ChatOf(convo, 24);
    req.set_chat_template(kTemplate);
    const Completion c = gw.Chat(req);
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    want += c.text + "\n";
    convo.push_back({"assistant", c.text});
    convo.push_back({"user", next});
  }
  EXPECT_EQ(r.out, want);
}

}  // namespace
}  // namespace thermocline::testing
