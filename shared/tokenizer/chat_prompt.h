// Where a chat template meets the vocabulary: the template a GGUF carries with the BOS/EOS texts
// it is rendered with (what Hugging Face passes as bos_token / eos_token), and how a rendered
// prompt becomes token ids. Shared by `thermocline render-template`, `thermocline chat` and the
// gateway's Chat call, so that all three see a model's template and tokenize its output alike.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "shared/gguf/gguf.h"
#include "shared/tokenizer/tokenizer.h"

namespace thermocline {

struct ModelChatTemplate {
  // tokenizer.chat_template; nullopt when the file has none.
  std::optional<std::string> source;
  // The named variants, tokenizer.chat_template.NAME (Hugging Face's "tool_use", "rag" ...),
  // by NAME.
  std::map<std::string, std::string> named;
  // The texts of tokenizer.ggml.bos_token_id / eos_token_id; "" when the file names none.
  std::string bos_token;
  std::string eos_token;
};

// InvalidArgument for a named template the model lacks, naming the ones it has:
// "<field> 'rag': model M has tool_use (tokenizer.chat_template.NAME)".
absl::Status UnknownChatTemplateName(std::string_view field, std::string_view name,
                                     std::string_view model,
                                     const std::vector<std::string>& known);

// Reads the template and the BOS/EOS texts from `file`'s metadata (a header-only GgufFile is
// enough). Keys that are missing or of the wrong type read as absent.
ModelChatTemplate ReadModelChatTemplate(const GgufFile& file);

// The token ids of a prompt rendered by a chat template, by llama.cpp's rule for templated
// prompts: special-token text (<|im_start|>, <s> ...) is parsed into its ids (parse_special),
// and BOS / EOS are added as the vocabulary says (add_special) except that a BOS text the
// template already wrote at the very start, or an EOS text at the very end, is not added a
// second time (the template's own becomes that token).
std::vector<int32_t> EncodeChatPrompt(const Tokenizer& tokenizer, std::string_view rendered);

}  // namespace thermocline
