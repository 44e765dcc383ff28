// gateway/openai_json.h: OpenAI request bodies into the gRPC API's messages (field types
// refused by name, unsupported fields refused, OpenAI's defaults), gateway statuses into
// OpenAI-shaped errors with the HTTP status and `param`.
#include "gateway/openai_json.h"

#include <limits>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace thermocline::gateway {
namespace {

// Parses `body` for the endpoint; returns the error (http_status 0 when it parsed).
ApiError Parse(const std::string& body, bool chat, CompletionRequest* out = nullptr) {
  CompletionRequest local;
  CompletionRequest* r = out != nullptr ? out : &local;
  OpenAiJson j;
  ApiError e;
  if (!ParseBody(body, 64, &j, &e)) return e;
  if (!ParseCompletionRequest(j, chat, r, &e)) return e;
  return ApiError{.http_status = 0};
}

TEST(OpenAiJsonTest, WrongTypesAreRefusedNamingTheField) {
  struct Case {
    const char* body;
    bool chat;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "temperature": "hot"})", false, "temperature",
       "temperature must be a number, got a string"},
      {R"({"prompt": "x", "max_tokens": 1.5})", false, "max_tokens",
       "max_tokens must be an integer, got the number 1.5"},
      {R"({"prompt": "x", "max_tokens": 99999999999})", false, "max_tokens",
       "max_tokens must be an integer in [-2147483648, 2147483647]"},
      {R"({"prompt": "x", "stop": 5})", false, "stop",
       "stop must be a string or an array of strings, got the number 5"},
      {R"({"prompt": "x", "stop": ["a", 1]})", false, "stop[1]",
       "stop[1] must be a string, got the number 1"},
      {R"({"prompt": "x", "stream": "yes"})", false, "stream", "stream must be a boolean, got a string"},
      {R"({"prompt": "x", "stream_options": {"include_usage": 1}})", false,
       "stream_options.include_usage", "stream_options.include_usage must be a boolean, got the number 1"},
      {R"({"prompt": "x", "seed": "42"})", false, "seed", "seed must be an integer, got a string"},
      {R"({"prompt": "x", "user": 7})", false, "user", "user must be a string, got the number 7"},
      {R"({"prompt": {"text": "x"}})", false, "prompt",
       "prompt must be a string, an array of token ids, or an array holding one of those; got an object"},
      {R"({"prompt": [1, "a"]})", false, "prompt[1]", "prompt[1] must be an integer, got a string"},
      {R"({"prompt": "x", "logprobs": true})", false, "logprobs",
       "logprobs must be an integer, got true"},
      {R"({"messages": {"role": "user"}})", true, "messages", "messages must be an array, got an object"},
      {R"({"messages": ["hi"]})", true, "messages[0]", "messages[0] must be an object, got a string"},
      {R"({"messages": [{"role": "user", "content": 3}]})", true, "messages[0].content",
       "messages[0].content must be a string, an array of text parts or null, got the number 3"},
      {R"({"messages": [{"content": "hi"}]})", true, "messages[0].role", "messages[0].role must be a string"},
      {R"({"messages": [{"role": "user", "content": "x", "name": 1}]})", true, "messages[0].name",
       "messages[0].name must be a string, got the number 1"},
      {R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", true, "messages[0].tool_calls",
       "messages[0].tool_calls must be an array, got an object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})", true, "logprobs",
       "logprobs must be a boolean, got the number 2"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": "f"})", true, "tools",
       "tools must be an array, got a string"},
  };
  for (const Case& c : cases) {
    const ApiError e = Parse(c.body, c.chat);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.message, c.message) << c.body;
  }
}

TEST(OpenAiJsonTest, WhatIsNotSupportedYetIsRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": "x", "echo": true})", "echo"},
      {R"({"prompt": "x", "best_of": 2})", "best_of"},
      {R"({"prompt": "x", "suffix": "end"})", "suffix"},
      {R"({"prompt": "x", "logit_bias": {"5": 1}})", "logit_bias"},
      {R"({"prompt": "x", "n": 17})", "n"},
      {R"({"prompt": "x", "n": 0})", "n"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = Parse(body, false);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
  }
  EXPECT_NE(Parse(R"({"prompt": "x", "echo": true})", false).message.find("not supported yet"),
            std::string::npos);
  const ApiError image = Parse(
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
      true);
  EXPECT_EQ(image.param, "messages[0].content[0].type");
  EXPECT_EQ(image.code, "unsupported");
  // Accepted: text response format, empty logit_bias, echo false, best_of 1.
  EXPECT_EQ(Parse(R"({"prompt": "x", "response_format": {"type": "text"}, "logit_bias": {},
                      "echo": false, "best_of": 1})",
                  false)
                .http_status,
            0);
}

TEST(OpenAiJsonTest, FieldsBecomeTheProtoRequest) {
  CompletionRequest r;
  ASSERT_EQ(Parse(R"({"model": "m", "prompt": "Once", "max_tokens": 7, "stop": "x", "seed": -1,
                      "top_k": -1, "n": 3, "stream": true, "stream_options": {"include_usage": true},
                      "logprobs": 2, "ignore_eos": true, "stop_token_ids": [5], "unknown": [1]})",
                  false, &r)
                .http_status,
            0);
  const v1::GenerateRequest& g = r.generate_request;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(g.text(), "Once");
  EXPECT_EQ(g.max_new_tokens(), 7);
  EXPECT_TRUE(r.max_tokens_given);
  ASSERT_EQ(g.stop_size(), 1);
  EXPECT_EQ(g.stop(0), "x");
  EXPECT_EQ(g.seed(), std::numeric_limits<uint64_t>::max());  // -1, two's complement
  EXPECT_EQ(g.top_k(), 0);                                     // vLLM's -1 = off
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(g.logprobs());
  EXPECT_EQ(g.top_logprobs(), 2);
  EXPECT_TRUE(g.ignore_eos());
  ASSERT_EQ(g.stop_token_ids_size(), 1);
  // OpenAI's sampling defaults, not thermocline generate's.
  EXPECT_EQ(g.temperature(), 1.0f);
  EXPECT_EQ(g.top_p(), 1.0f);
  EXPECT_EQ(g.min_p(), 0.0f);
  EXPECT_FALSE(g.has_repetition_penalty());

  CompletionRequest ids;
  ASSERT_EQ(Parse(R"({"prompt": [[1, 403, 407]]})", false, &ids).http_status, 0);
  ASSERT_EQ(ids.generate_request.token_ids().ids_size(), 3);
  EXPECT_FALSE(ids.max_tokens_given);

  CompletionRequest chat;
  ASSERT_EQ(Parse(R"({"messages": [{"role": "system", "content": null},
                                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]}],
                      "max_completion_tokens": 9, "max_tokens": 4, "logprobs": true,
                      "top_logprobs": 3, "chat_template_kwargs": {"x": 1}})",
                  true, &chat)
                .http_status,
            0);
  const v1::ChatRequest& c = chat.chat_request;
  ASSERT_EQ(c.messages_size(), 2);
  EXPECT_FALSE(c.messages(0).has_content());  // null stays null for the template
  EXPECT_EQ(c.messages(1).content(), "a\nb");
  EXPECT_EQ(c.max_new_tokens(), 9);            // max_completion_tokens wins
  EXPECT_EQ(chat.max_tokens_name, "max_completion_tokens");
  EXPECT_TRUE(c.logprobs());
  EXPECT_EQ(c.top_logprobs(), 3);
  EXPECT_EQ(c.template_kwargs(), R"({"x":1})");
}

TEST(OpenAiJsonTest, BodiesThatAreNotJsonObjects) {
  for (const char* body : {"", "{", "[1]", "\"x\"", "{\"a\": 1} trailing"}) {
    const ApiError e = Parse(body, false);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.code, "invalid_json") << body;
    EXPECT_TRUE(e.param.empty()) << body;
  }
  std::string deep = R"({"prompt": "x", "a": )";
  for (int i = 0; i < 200; ++i) deep += "[";
  for (int i = 0; i < 200; ++i) deep += "]";
  deep += "}";
  EXPECT_EQ(Parse(deep, false).message, "the request body nests deeper than 64 levels");
}

TEST(OpenAiJsonTest, StatusesBecomeHttpErrorsNamingTheField) {
  ApiError e = FromStatus(absl::InvalidArgumentError("max_new_tokens must be >= 1, got 0"),
                          "max_completion_tokens");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "max_completion_tokens");
  EXPECT_EQ(e.message, "max_completion_tokens must be >= 1, got 0");
  EXPECT_EQ(e.code, "invalid_argument");
  e = FromStatus(absl::InvalidArgumentError(
                     "prompt (5 tokens) + max_new_tokens (300) exceeds the context of 256 positions"),
                 "max_tokens");
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.message, "prompt (5 tokens) + max_tokens (300) exceeds the context of 256 positions");
  EXPECT_EQ(FromStatus(absl::InvalidArgumentError("stop[1] must not be empty"), "max_tokens").param,
            "stop[1]");
  EXPECT_EQ(FromStatus(absl::InvalidArgumentError("messages[0].role must be system, user, "
                                                  "assistant or tool, got \"x\""),
                       "max_tokens")
                .param,
            "messages[0].role");
  EXPECT_EQ(FromStatus(absl::InvalidArgumentError("prompt text must be valid UTF-8"), "max_tokens")
                .param,
            "prompt");
  EXPECT_EQ(FromStatus(absl::InvalidArgumentError("chat_template: line 1, column 2: x"),
                       "max_tokens")
                .param,
            "chat_template");
  EXPECT_EQ(FromStatus(absl::InvalidArgumentError("the chat template rendered an empty prompt"),
                       "max_tokens")
                .param,
            "messages");
  EXPECT_EQ(FromStatus(absl::FailedPreconditionError("model m has no chat template"), "max_tokens")
                .http_status,
            400);
  EXPECT_EQ(FromStatus(absl::UnauthenticatedError("x"), "max_tokens").http_status, 401);
  EXPECT_EQ(FromStatus(absl::ResourceExhaustedError("queue is full"), "max_tokens").http_status, 429);
  EXPECT_EQ(FromStatus(absl::UnavailableError("loading"), "max_tokens").http_status, 503);
  EXPECT_EQ(FromStatus(absl::DataLossError("ring"), "max_tokens").http_status, 500);
  EXPECT_TRUE(FromStatus(absl::UnavailableError("loading"), "max_tokens").param.empty());

  const OpenAiJson body = ErrorBody(e);
  ASSERT_TRUE(body.contains("error"));
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_EQ(body["error"]["code"], "invalid_argument");
  EXPECT_TRUE(ErrorBody(ApiError{.http_status = 503, .message = "m"})["error"]["param"].is_null());
  EXPECT_EQ(ErrorBody(ApiError{.http_status = 429})["error"]["type"], "rate_limit_error");
}

}  // namespace
// Structured output: response_format and grammar become the proto's json_schema / grammar
// (compiled by validate.cc); shapes that are wrong are refused naming the field.
TEST(OpenAiJsonTest, ResponseFormatAndGrammarBecomeTheProtoFields) {
  CompletionRequest r;
  ASSERT_EQ(Parse(R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
                      {"name": "n", "strict": true, "schema": {"type": "object",
                       "properties": {"a": {"type": "integer"}}}}}})",
                  false, &r)
                .http_status,
            0);
  EXPECT_EQ(r.generate_request.json_schema(),
            R"({"type":"object","properties":{"a":{"type":"integer"}}})");
  EXPECT_EQ(r.generate_request.grammar(), "");
  CompletionRequest c;
  ASSERT_EQ(Parse(R"({"messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "json_object"}})",
                  true, &c)
                .http_status,
            0);
  EXPECT_EQ(c.chat_request.json_schema(), R"({"type":"object"})");
  CompletionRequest g;
  ASSERT_EQ(Parse(R"({"prompt": "x", "grammar": "root ::= \"a\"", "response_format":
                      {"type": "text"}})", false, &g).http_status, 0);
  EXPECT_EQ(g.generate_request.grammar(), "root ::= \"a\"");
  EXPECT_EQ(g.generate_request.json_schema(), "");

  const std::pair<const char*, const char*> bad[] = {
      {R"({"prompt": "x", "grammar": 5})", "grammar"},
      {R"({"prompt": "x", "response_format": {"type": 1}})", "response_format.type"},
      {R"({"prompt": "x", "response_format": {"type": "xml"}})", "response_format.type"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})",
       "response_format.json_schema"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {}}})",
       "response_format.json_schema.schema"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
           {"schema": {}, "strict": "yes"}}})", "response_format.json_schema.strict"},
  };
  for (const auto& [body, param] : bad) {
    const ApiError e = Parse(body, false);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
  }
  // validate.cc's compiler messages name the proto field; here it is response_format's.
  const ApiError e = FromStatus(
      absl::InvalidArgumentError("json_schema: pattern at $.properties.a is not supported"),
      "max_tokens");
  EXPECT_EQ(e.param, "response_format.json_schema");
  EXPECT_EQ(e.message, "response_format.json_schema: pattern at $.properties.a is not supported");
  EXPECT_EQ(FromStatus(absl::InvalidArgumentError("grammar: line 1, column 3: x"), "max_tokens")
                .param,
            "grammar");
}

}  // namespace thermocline::gateway
