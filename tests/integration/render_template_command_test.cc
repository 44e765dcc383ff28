// `thermocline render-template`: prints exactly the rendered prompt (compared with Python's
// Jinja2 on the same template and inputs), reads a model's template and special tokens from
// its GGUF, and refuses a model without a template by name.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "shared/gguf/gguf.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using json = nlohmann::ordered_json;
using testing::RunCommand;

const char* const kMessages = R"json([
  {"role": "system", "content": "You are terse."},
  {"role": "user", "content": "Hi — ça va? 🌍"},
  {"role": "assistant", "content": "Oui."},
  {"role": "user", "content": "Tools?"}])json";

const char* const kTools = R"json([{"type": "function", "function": {"name": "lookup",
  "description": "Look something up", "parameters": {"type": "object",
  "properties": {"q": {"type": "string", "description": "query"}}, "required": ["q"]}}}])json";

class RenderTemplateCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir();
    messages_ = Write("messages.json", kMessages);
    tools_ = Write("tools.json", kTools);
  }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  testing::CommandResult Thermocline(std::vector<std::string> args) {
    args.insert(args.begin(), {testing::BinDir() + "/thermocline", "render-template"});
    return RunCommand(args);
  }

  // Python's Jinja2 (Hugging Face's setup) on the same inputs; tools=None when absent.
  std::vector<json> Reference(const std::vector<std::pair<std::string, json>>& cases) {
    json py = json::array();
    for (const auto& [source, vars] : cases)
      py.push_back({{"template", source}, {"variables", vars}});
    const std::string path = Write("cases.json", py.dump());
    auto r = RunCommand({"/usr/bin/python3", THERMOCLINE_CHAT_REFERENCE_PY, path});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<json> out;
    for (const json& x : json::parse(r.out)) out.push_back(x);
    return out;
  }

  static json Vars(bool agp, const std::string& bos, const std::string& eos, bool tools) {
    return {{"messages", json::parse(kMessages)},
            {"tools", tools ? json::parse(kTools) : json(nullptr)},
            {"add_generation_prompt", agp},
            {"bos_token", bos},
            {"eos_token", eos}};
  }

  std::string dir_, messages_, tools_;
};

TEST_F(RenderTemplateCommand, TemplateFileMatchesPythonJinja2) {
  const std::string qwen =
      testing::SharedDataDir() + "/chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja";
  const std::string hermes = testing::SharedDataDir() +
                             "/chat-templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja";
  const std::string phi =
      testing::SharedDataDir() + "/chat-templates/microsoft-Phi-3.5-mini-instruct.jinja";
  const std::vector<json> want = Reference({
      {testing::ReadFileOrDie(qwen), Vars(false, "", "", false)},
      {testing::ReadFileOrDie(qwen), Vars(true, "", "", true)},
      {testing::ReadFileOrDie(hermes), Vars(true, "<B>", "<E>", true)},
      {testing::ReadFileOrDie(phi), Vars(false, "", "<|endoftext|>", false)},
  });
  ASSERT_EQ(want.size(), 4u);
  const std::vector<std::vector<std::string>> args = {
      {"--template", qwen, "--messages", messages_},
      {"--template", qwen, "--messages", messages_, "--add-generation-prompt", "--tools", tools_},
      {"--template", hermes, "--messages", messages_, "--add-generation-prompt", "--tools", tools_,
       "--bos-token", "<B>", "--eos-token", "<E>"},
      {"--template", phi, "--messages", messages_, "--eos-token", "<|endoftext|>"},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(want[i]["ok"].get<bool>()) << want[i].dump();
    auto r = Thermocline(args[i]);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want[i]["output"].get<std::string>());
    EXPECT_EQ(r.err, "");
  }
}

TEST_F(RenderTemplateCommand, ModelTemplateAndSpecialTokensComeFromTheGguf) {
  const std::string model = testing::SharedDataDir() + "/tokenizers/ggml-vocab-phi-3.gguf";
  auto file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok()) << file.status();
  auto source = (*file)->GetString("tokenizer.chat_template");
  ASSERT_TRUE(source.ok()) << source.status();
  const GgufArray* tokens = *(*file)->GetArray("tokenizer.ggml.tokens");
  const std::string bos =
      *tokens->items[*(*file)->GetInt("tokenizer.ggml.bos_token_id")].AsString();
  const std::string eos =
      *tokens->items[*(*file)->GetInt("tokenizer.ggml.eos_token_id")].AsString();
  const std::vector<json> want = Reference(
      {{*source, Vars(false, bos, eos, false)}, {*source, Vars(true, "[B]", eos, false)}});
  ASSERT_TRUE(want[0]["ok"].get<bool>() && want[1]["ok"].get<bool>());

  auto r = Thermocline({"--model", model, "--messages", messages_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, want[0]["output"].get<std::string>());
  r = Thermocline(
      {"--model", model, "--messages", messages_, "--add-generation-prompt", "--bos-token", "[B]"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, want[1]["output"].get<std::string>());
}

// --template-name NAME renders tokenizer.chat_template.NAME (a copy of Phi-3's vocabulary
// given one), as Python's Jinja2 renders that text; an unknown name lists the known ones.
TEST_F(RenderTemplateCommand, NamedTemplateComesFromItsKey) {
  const std::string vocab = testing::SharedDataDir() + "/tokenizers/ggml-vocab-phi-3.gguf";
  const std::string named =
      "{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}{{ eos_token }}{% endfor %}";
  const std::string model = testing::TempDir() + "/phi3-named.gguf";
  const absl::Status copied = testing::CopyGgufWithMetadata(
      vocab, {{"tokenizer.chat_template.tool_use", GgufString(named)}}, model);
  ASSERT_TRUE(copied.ok()) << copied;
  const std::vector<json> want = Reference({{named, Vars(false, "<s>", "<|endoftext|>", false)}});
  ASSERT_TRUE(want[0]["ok"].get<bool>());
  auto r = Thermocline({"--model", model, "--template-name", "tool_use", "--messages", messages_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, want[0]["output"].get<std::string>());
  r = Thermocline({"--model", model, "--template-name", "rag", "--messages", messages_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("'rag'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("has tool_use"), std::string::npos) << r.err;
}

TEST_F(RenderTemplateCommand, ModelWithoutTemplateIsRefusedByName) {
  const std::string model = testing::ModelPath("stories260K/stories260K.gguf");
  auto r = Thermocline({"--model", model, "--messages", messages_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(model), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;
}

TEST_F(RenderTemplateCommand, BadInputsAreClearErrors) {
  const std::string tmpl = Write("t.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  auto r = Thermocline({"--messages", messages_});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("exactly one of --model and --template"), std::string::npos) << r.err;

  const std::string bad = Write("bad.json", "[{\"role\": \"user\", ");
  r = Thermocline({"--template", tmpl, "--messages", bad});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(bad), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;

  const std::string norole = Write("norole.json", "[{\"content\": \"x\"}]");
  r = Thermocline({"--template", tmpl, "--messages", norole});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("messages[0] has no \"role\""), std::string::npos) << r.err;

  const std::string raising = Write("raise.jinja", "x\n{{ raise_exception('no tools here') }}");
  r = Thermocline({"--template", raising, "--messages", messages_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no tools here"), std::string::npos) << r.err;

  r = Thermocline({"--template", dir_ + "/missing.jinja", "--messages", messages_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.jinja"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace thermocline
