// Acceptance: every chat template in ../shared/chat-templates/, on a fixed set of conversations,
// renders byte for byte as Python's Jinja2 renders it (set up as Hugging Face's
// apply_chat_template sets it up, tests/helpers/chat_template_reference.py); where Python
// raises, the C++ engine must fail too.
#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "shared/chat/chat_template.h"
#include "tests/test_support.h"

namespace thermocline::chat {
namespace {

using json = nlohmann::ordered_json;

// strftime_now's clock in both engines: 2024-07-26 12:00 UTC.
constexpr int64_t kNow = 1721995200;

// Tools in OpenAI's format, with the schema features the tool-use templates translate (types,
// enums, defaults, arrays, nested objects, bounds, nullable).
const char* const kTools = R"json([
  {"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius",
                 "description": "Temperature unit"}},
      "required": ["city"]}}},
  {"type": "function", "function": {
    "name": "search",
    "description": "Search the web.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "What to look for", "minLength": 1},
        "max_results": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3,
                        "description": "At most this many"},
        "tags": {"type": "array", "items": {"type": "string"}, "examples": [["news", "tech"]],
                 "description": "Topic tags"},
        "filters": {"type": "object", "properties": {"lang": {"type": "string"},
                                                      "safe": {"type": "boolean"}},
                    "required": ["lang"], "description": "Result filters",
                    "additionalProperties": {"type": "string"}},
        "score": {"type": "number", "nullable": true, "description": "Minimum score"}},
      "required": ["query"]}}}
])json";

// Each conversation is {"name", "messages", optional "tools" (true: kTools), optional "extra"}.
const char* const kConversations = R"json([
  {"name": "single user turn", "messages": [{"role": "user", "content": "Hello!"}]},
  {"name": "system and user", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2+2?"}]},
  {"name": "multi-turn with system", "messages": [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"}]},
  {"name": "multi-turn without system", "messages": [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me a joke.\nA short one."},
    {"role": "assistant", "content": "Why did the chicken cross the road?"}]},
  {"name": "unicode", "messages": [
    {"role": "system", "content": "Réponds en français. «Guillemets» — ok"},
    {"role": "user", "content": "Grüße, 世界! 🌍 'single' \"double\" <tag> & back\\slash\ttab"},
    {"role": "assistant", "content": "Привет 👋 — ça va?\r\nЁлка"},
    {"role": "user", "content": "ß ǅ ﬁ İ — zero\u200bwidth, nbsp\u00a0here"}]},
  {"name": "empty contents", "messages": [
    {"role": "system", "content": ""},
    {"role": "user", "content": ""},
    {"role": "assistant", "content": ""},
    {"role": "user", "content": "   "}]},
  {"name": "null assistant content", "messages": [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": null},
    {"role": "user", "content": "Still there?"}]},
  {"name": "only a system message", "messages": [
    {"role": "system", "content": "System only."}]},
  {"name": "no messages", "messages": []},
  {"name": "assistant prefill", "messages": [
    {"role": "user", "content": "Write a haiku."},
    {"role": "assistant", "content": "Autumn moonlight"}]},
  {"name": "thinking in history", "messages": [
    {"role": "user", "content": "1+1?"},
    {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n2"},
    {"role": "user", "content": "2+2?"}]},
  {"name": "tools offered, no calls", "tools": true, "messages": [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "What's the weather in Paris?"}]},
  {"name": "tool call, arguments as a JSON string", "tools": true, "messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
     "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "It is 21°C and clear in Paris."}]},
  {"name": "tool call, arguments as an object", "tools": true, "messages": [
    {"role": "system", "content": "Use tools when needed."},
    {"role": "user", "content": "Weather in Oslo in fahrenheit?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "c1", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "fahrenheit"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temperature\": 40}"}]},
  {"name": "two tool calls and two results", "tools": true, "messages": [
    {"role": "user", "content": "Weather in Rome and news about it?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "a", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
      {"id": "b", "type": "function",
       "function": {"name": "search", "arguments": "{\"query\": \"Rome news\"}"}}]},
    {"role": "tool", "tool_call_id": "a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "b", "content": "nothing new"},
    {"role": "assistant", "content": "Sunny, and no news."},
    {"role": "user", "content": "Thanks!"}]},
  {"name": "tools in the system prompt, fixed date", "tools": true,
   "extra": {"tools_in_user_message": false, "date_string": "01 Jan 2025"},
   "messages": [
    {"role": "system", "content": "Tools are listed above."},
    {"role": "user", "content": "Search for llamas"}]},
  {"name": "tool call without tools offered", "messages": [
    {"role": "system", "content": "Be exact."},
    {"role": "user", "content": "Call noop."},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "x", "type": "function", "function": {"name": "noop", "arguments": "{}"}}]},
    {"role": "tool", "content": "done"}]},
  {"name": "unknown role", "messages": [{"role": "narrator", "content": "Once upon a time"}]}
])json";

std::vector<std::string> TemplateFiles() {
  const std::string dir = thermocline::testing::SharedDataDir() + "/chat-templates";
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 6 && name.substr(name.size() - 6) == ".jinja") {
        files.push_back(dir + "/" + name);
      }
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  return files;
}

struct Case {
  std::string template_file;
  std::string conversation;
  bool add_generation_prompt;
  ChatTemplateInputs inputs;
};

TEST(ChatTemplateReference, EveryTemplateMatchesPythonJinja2) {
  const std::vector<std::string> files = TemplateFiles();
  ASSERT_GE(files.size(), 13u) << "chat templates missing under SharedDataDir()/chat-templates";
  const json conversations = json::parse(kConversations);
  const json tools = json::parse(kTools);

  std::vector<Case> cases;
  json py_cases = json::array();
  for (const std::string& file : files) {
    const std::string source = thermocline::testing::ReadFileOrDie(file);
    for (const json& conv : conversations) {
      for (bool agp : {false, true}) {
        Case c{file, conv["name"].get<std::string>(), agp, {}};
        c.inputs.messages = conv["messages"];
        if (conv.contains("tools")) c.inputs.tools = tools;
        c.inputs.add_generation_prompt = agp;
        c.inputs.bos_token = "<|begin_of_text|>";
        c.inputs.eos_token = "<|eot|>";
        // firefunction-v2 needs `functions` and `datetime`; no other template reads them.
        c.inputs.extra = {{"functions", "[{\"name\": \"noop\"}]"}, {"datetime", "2024-07-26"}};
        if (conv.contains("extra")) {
          for (const auto& [k, v] : conv["extra"].items()) c.inputs.extra[k] = v;
        }
        c.inputs.now_unix_seconds = kNow;
        // What Hugging Face passes: messages, tools (None when absent), add_generation_prompt,
        // the special tokens, then the caller's keyword arguments.
        json vars = json::object();
        vars["messages"] = c.inputs.messages;
        vars["tools"] = c.inputs.tools ? *c.inputs.tools : json(nullptr);
        vars["add_generation_prompt"] = agp;
        vars["bos_token"] = c.inputs.bos_token;
        vars["eos_token"] = c.inputs.eos_token;
        for (const auto& [k, v] : c.inputs.extra.items()) vars[k] = v;
        py_cases.push_back({{"template", source}, {"variables", vars}, {"now", kNow}});
        cases.push_back(std::move(c));
      }
    }
  }

  const std::string dir = thermocline::testing::TempDir();
  const std::string cases_path = dir + "/cases.json";
  std::ofstream(cases_path) << py_cases.dump();
  const auto run = thermocline::testing::RunCommand(
      {"/usr/bin/python3", THERMOCLINE_CHAT_REFERENCE_PY, cases_path});
  ASSERT_EQ(run.exit_code, 0) << "the Jinja2 reference failed (is python3-jinja2 installed?)\n"
                              << run.err;
  const json results = json::parse(run.out);
  ASSERT_EQ(results.size(), cases.size());

  int rendered = 0;
  int raised = 0;
  std::map<std::string, int> rendered_per_template;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const json& want = results[i];
    const std::string label = c.template_file.substr(c.template_file.rfind('/') + 1) + " / " +
                              c.conversation + (c.add_generation_prompt ? " / +gen" : "");
    absl::StatusOr<ChatTemplate> t =
        ChatTemplate::Parse(thermocline::testing::ReadFileOrDie(c.template_file));
    ASSERT_TRUE(t.ok()) << label << ": " << t.status();
    absl::StatusOr<std::string> got = t->Render(c.inputs);
    if (want["ok"].get<bool>()) {
      ++rendered;
      ++rendered_per_template[c.template_file];
      ASSERT_TRUE(got.ok()) << label << ": Python rendered it, C++ failed: " << got.status();
      EXPECT_EQ(*got, want["output"].get<std::string>()) << label;
    } else {
      ++raised;
      EXPECT_FALSE(got.ok()) << label << ": Python raised " << want["error"].get<std::string>()
                             << " but C++ rendered:\n"
                             << *got;
    }
  }
  // The comparison is only meaningful if most cases render: every template renders several.
  for (const std::string& file : files) {
    EXPECT_GE(rendered_per_template[file], 4) << file << " rendered too few conversations";
  }
  std::cout << "chat templates: " << files.size() << " templates, " << cases.size()
            << " cases: " << rendered << " rendered identically, " << raised << " raised in both\n";
}

}  // namespace
}  // namespace thermocline::chat
