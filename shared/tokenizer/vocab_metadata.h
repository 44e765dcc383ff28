// Carrying a vocabulary from one GGUF into another: what `thermocline synth --tokenizer-from`
// needs so that a synthetic model tokenizes exactly like the file its vocabulary came from.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "shared/gguf/gguf.h"

namespace thermocline {

// Copies every metadata key of `vocab` that starts with "tokenizer." (tokens, types, scores,
// merges, special ids, flags, chat templates) into `out`, replacing keys `out` already has,
// after checking that they load as a Tokenizer (an unsupported or broken vocabulary is an
// error, and nothing is copied). Returns the vocabulary size: the model's embedding and output
// rows must be that many.
absl::StatusOr<int32_t> CopyTokenizerMetadata(const GgufFile& vocab, GgufWriter& out);

}  // namespace thermocline
