// `thermocline render-template`: a conversation rendered through a chat template (the model's
// `tokenizer.chat_template`, or a file), printed exactly as the model would see it.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "shared/chat/chat_template.h"
#include "shared/gguf/gguf.h"
#include "shared/tokenizer/chat_prompt.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(what, " ", path, ": read error"));
  return ss.str();
}

absl::StatusOr<nlohmann::ordered_json> ReadJson(const std::string& path, const std::string& what) {
  absl::StatusOr<std::string> text = ReadFile(path, what);
  if (!text.ok()) return text.status();
  try {
    return nlohmann::ordered_json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": not valid JSON: ", e.what()));
  }
}

int Fail(const absl::Status& s) {
  std::cerr << "thermocline render-template: " << s.message() << "\n";
  return 1;
}

int RunRenderTemplate(const std::vector<std::string>& args) {
  po::options_description opts("options");
  opts.add_options()("model", po::value<std::string>(),
                     "GGUF whose tokenizer.chat_template to use")(
      "template", po::value<std::string>(), "a Jinja template file instead of a model's")(
      "template-name", po::value<std::string>(),
      "with --model: its named template tokenizer.chat_template.NAME (e.g. tool_use)")(
      "messages", po::value<std::string>()->required(),
      "JSON file: an array of {\"role\": ..., \"content\": ...} messages (OpenAI's format)")(
      "add-generation-prompt", po::bool_switch(), "end with the assistant turn's opening")(
      "bos-token", po::value<std::string>(), "bos_token (default: the model's BOS text)")(
      "eos-token", po::value<std::string>(), "eos_token (default: the model's EOS text)")(
      "tools", po::value<std::string>(), "JSON file: an array of tool definitions");
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("render-template",
                    "(--model M.gguf | --template F.jinja) --messages FILE.json [options]", opts,
                    {}, args, vm, exit_code)) {
    return exit_code;
  }
  if (vm.count("template-name") && !vm.count("model")) {
    std::cerr << "thermocline render-template: --template-name needs --model\n";
    return 2;
  }
  if (vm.count("model") == vm.count("template")) {
    std::cerr << "thermocline render-template: give exactly one of --model and --template\n";
    return 2;
  }
  chat::ChatTemplateInputs in;
  std::string source;
  if (vm.count("model")) {
    const std::string path = vm["model"].as<std::string>();
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    if (!file.ok()) return Fail(file.status());
    ModelChatTemplate t = ReadModelChatTemplate(**file);
    if (vm.count("template-name")) {
      const std::string name = vm["template-name"].as<std::string>();
      auto it = t.named.find(name);
      if (it == t.named.end()) {
        std::vector<std::string> names;
        for (const auto& [n, text] : t.named) names.push_back(n);
        return Fail(UnknownChatTemplateName("--template-name", name, path, names));
      }
      t.source = it->second;
    }
    if (!t.source.has_value()) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "model ", path, " has no chat template (tokenizer.chat_template); pass --template")));
    }
    source = *std::move(t.source);
    in.bos_token = std::move(t.bos_token);
    in.eos_token = std::move(t.eos_token);
  } else {
    absl::StatusOr<std::string> text = ReadFile(vm["template"].as<std::string>(), "template");
    if (!text.ok()) return Fail(text.status());
    source = std::move(*text);
  }
  if (vm.count("bos-token")) in.bos_token = vm["bos-token"].as<std::string>();
  if (vm.count("eos-token")) in.eos_token = vm["eos-token"].as<std::string>();
  in.add_generation_prompt = vm["add-generation-prompt"].as<bool>();
  absl::StatusOr<nlohmann::ordered_json> messages =
      ReadJson(vm["messages"].as<std::string>(), "messages");
  if (!messages.ok()) return Fail(messages.status());
  in.messages = std::move(*messages);
  if (vm.count("tools")) {
    absl::StatusOr<nlohmann::ordered_json> tools = ReadJson(vm["tools"].as<std::string>(), "tools");
    if (!tools.ok()) return Fail(tools.status());
    in.tools = std::move(*tools);
  }
  absl::StatusOr<std::string> prompt = chat::RenderChatTemplate(source, in);
  if (!prompt.ok()) return Fail(prompt.status());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

const CommandRegistrar kRegistrar({"render-template",
                                   "print a conversation rendered through a chat template",
                                   &RunRenderTemplate});

}  // namespace
}  // namespace thermocline::tools
