// `thermocline tokenize`: the token ids of standard input under a GGUF's vocabulary, one line,
// space-separated. Works on vocabulary-only files (no tensors) such as llama.cpp's
// ggml-vocab-*.gguf, so a tokenizer can be checked against llama.cpp's without the model.
#include <cstdint>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "shared/tokenizer/tokenizer.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int RunTokenize(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("model", po::value<std::string>()->required(),
                        "GGUF file whose tokenizer.* keys to use (a model or a vocabulary)")(
      "add-bos", po::bool_switch(), "put the vocabulary's BOS id first")(
      "parse-special", po::bool_switch(),
      "text of control / user-defined tokens (e.g. <|im_start|>) becomes their ids");
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("tokenize", "--model M.gguf [--add-bos] [--parse-special] < TEXT", options,
                    po::positional_options_description(), args, vm, exit_code)) {
    return exit_code;
  }
  const std::string path = vm["model"].as<std::string>();
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(path);
  if (!tok.ok()) {
    std::cerr << "thermocline tokenize: " << tok.status().message() << "\n";
    return 1;
  }
  const bool add_bos = vm["add-bos"].as<bool>();
  if (add_bos && tok->bos() < 0) {
    std::cerr << "thermocline tokenize: --add-bos, but " << path << " has no BOS token\n";
    return 1;
  }
  std::cin >> std::noskipws;
  const std::string text((std::istreambuf_iterator<char>(std::cin)),
                         std::istreambuf_iterator<char>());
  if (std::cin.bad()) {
    std::cerr << "thermocline tokenize: cannot read standard input\n";
    return 1;
  }
  std::vector<int32_t> ids;
  if (add_bos) ids.push_back(tok->bos());
  const std::vector<int32_t> body =
      tok->Encode(text, EncodeOptions{.parse_special = vm["parse-special"].as<bool>()});
  ids.insert(ids.end(), body.begin(), body.end());
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ' ';
    line += std::to_string(ids[i]);
  }
  line += '\n';
  std::cout << line << std::flush;
  return std::cout.good() ? 0 : 1;
}

static CommandRegistrar registrar(
    {"tokenize", "print the token ids of standard input under a GGUF vocabulary", &RunTokenize});

}  // namespace
}  // namespace thermocline::tools
