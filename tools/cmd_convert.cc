// `thermocline convert`: turns a model from another format into a llama GGUF. The conversion
// itself lives in the library (shared/model/llama2c.h); this file only parses the command line.
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_format.h"
#include "shared/gguf/ggml_type.h"
#include "shared/model/llama2c.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int RunConvert(const std::vector<std::string>& args) {
  std::string from, out_path, type_name, name;
  std::vector<std::string> inputs;
  po::options_description opts("options");
  opts.add_options()
      ("from", po::value(&from)->required(), "source format: llama2c (run.c's version 0 "
                                             "checkpoint + tokenizer .bin)")
      ("output,o", po::value(&out_path)->required(), "GGUF file to write")
      ("type", po::value(&type_name)->default_value("f32"),
       "type of the weight matrices: f32, f16, bf16, q8_0 or q4_0 (norms stay f32; a matrix "
       "whose rows do not fit the block size becomes f16)")
      ("name", po::value(&name)->default_value("llama"), "general.name to record")
      ("inputs", po::value(&inputs)->composing(), "MODEL.bin TOKENIZER.bin");
  po::positional_options_description pos;
  pos.add("inputs", -1);
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("convert", "--from llama2c MODEL.bin TOKENIZER.bin -o OUT.gguf [options]",
                    opts, pos, args, vm, exit_code)) {
    return exit_code;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "thermocline convert: " << msg << "\n";
    return 1;
  };
  if (from != "llama2c") {
    return fail("--from '" + from + "' is not supported; the only source format is llama2c");
  }
  if (inputs.size() != 2) {
    return fail(absl::StrFormat("expected 2 input files (MODEL.bin TOKENIZER.bin), got %d",
                                inputs.size()));
  }
  const std::optional<GgmlType> type = TypeFromName(type_name);
  if (!type.has_value()) {
    return fail("--type '" + type_name + "' is not one of f32, f16, bf16, q8_0, q4_0");
  }

  Llama2cConvertOptions options;
  options.type = *type;
  options.name = name;
  absl::StatusOr<Llama2cConvertSummary> summary =
      ConvertLlama2cToGguf(inputs[0], inputs[1], out_path, options);
  if (!summary.ok()) return fail(std::string(summary.status().message()));

  const Llama2cConfig& c = summary->config;
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(out_path, ec);
  std::string fallback;
  if (summary->n_fallback_f16 > 0) {
    fallback = absl::StrFormat(" (%d as f16: rows not a multiple of the block size)",
                               summary->n_fallback_f16);
  }
  std::cout << absl::StrFormat(
      "wrote %s: llama, %d layers, dim %d, ffn %d, heads %d/%d, vocab %d, context %d, "
      "%d parameters, %d tensors, %s%s, %d bytes\n",
      out_path, c.n_layers, c.dim, c.hidden_dim, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len,
      summary->n_parameters, summary->n_tensors, TypeTraits(*type).name, fallback,
      ec ? 0 : static_cast<int64_t>(bytes));
  return 0;
}

static CommandRegistrar registrar(
    {"convert", "convert a llama2.c model and tokenizer to GGUF", &RunConvert});

}  // namespace
}  // namespace thermocline::tools
