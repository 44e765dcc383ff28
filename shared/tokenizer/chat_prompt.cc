#include "shared/tokenizer/chat_prompt.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace thermocline {
namespace {

// The text of token `key` (an id) in the vocabulary, or "" when the model names none.
std::string SpecialTokenText(const GgufFile& file, const std::string& key) {
  const absl::StatusOr<int64_t> id = file.GetInt(key);
  const absl::StatusOr<const GgufArray*> tokens = file.GetArray("tokenizer.ggml.tokens");
  if (!id.ok() || !tokens.ok() || *id < 0 || static_cast<size_t>(*id) >= (*tokens)->items.size()) {
    return "";
  }
  const std::string* s = (*tokens)->items[static_cast<size_t>(*id)].AsString();
  return s != nullptr ? *s : "";
}

}  // namespace

absl::Status UnknownChatTemplateName(std::string_view field, std::string_view name,
                                     std::string_view model,
                                     const std::vector<std::string>& known) {
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(field), " '", std::string(name), "': model ", std::string(model),
      known.empty() ? " has no named chat templates"
                    : absl::StrCat(" has ", absl::StrJoin(known, ", ")),
      " (tokenizer.chat_template.NAME)"));
}

ModelChatTemplate ReadModelChatTemplate(const GgufFile& file) {
  ModelChatTemplate t;
  const GgufValue* v = file.FindValue("tokenizer.chat_template");
  if (v != nullptr && v->AsString() != nullptr) t.source = *v->AsString();
  constexpr std::string_view kNamed = "tokenizer.chat_template.";
  for (const auto& [key, value] : file.metadata()) {
    if (key.size() > kNamed.size() && key.starts_with(kNamed) && value.AsString() != nullptr) {
      t.named[key.substr(kNamed.size())] = *value.AsString();
    }
  }
  t.bos_token = SpecialTokenText(file, "tokenizer.ggml.bos_token_id");
  t.eos_token = SpecialTokenText(file, "tokenizer.ggml.eos_token_id");
  return t;
}

std::vector<int32_t> EncodeChatPrompt(const Tokenizer& tokenizer, std::string_view rendered) {
  // llama.cpp (common/chat.cpp) cuts the template's own BOS / EOS text off before tokenizing
  // with add_special; the tokenizer then adds them back exactly once.
  if (tokenizer.add_bos_token() && tokenizer.bos() >= 0) {
    const std::string& bos = tokenizer.piece(tokenizer.bos());
    if (!bos.empty() && rendered.starts_with(bos)) rendered.remove_prefix(bos.size());
  }
  if (tokenizer.add_eos_token() && tokenizer.eos() >= 0) {
    const std::string& eos = tokenizer.piece(tokenizer.eos());
    if (!eos.empty() && rendered.ends_with(eos)) rendered.remove_suffix(eos.size());
  }
  return tokenizer.Encode(rendered, EncodeOptions{.add_special = true, .parse_special = true});
}

}  // namespace thermocline
