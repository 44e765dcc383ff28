#include "shared/tokenizer/vocab_metadata.h"

#include <string_view>

#include "shared/tokenizer/tokenizer.h"

namespace thermocline {

absl::StatusOr<int32_t> CopyTokenizerMetadata(const GgufFile& vocab, GgufWriter& out) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::FromGguf(vocab);
  if (!tok.ok()) return tok.status();
  for (const auto& [key, value] : vocab.metadata()) {
    if (std::string_view(key).starts_with("tokenizer.")) out.SetValue(key, value);
  }
  return tok->vocab_size();
}

}  // namespace thermocline
