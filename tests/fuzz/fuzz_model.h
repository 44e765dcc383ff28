// The tokenizer of stories260K for the fuzzers that need a real vocabulary (tokenizer,
// validation): THERMOCLINE_FUZZ_MODEL names the GGUF (scripts/fuzz.sh sets it); the file is
// parsed once per process.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "shared/gguf/gguf.h"
#include "shared/tokenizer/tokenizer.h"

namespace thermocline::fuzz {

inline const Tokenizer& ModelTokenizer() {
  static const Tokenizer* tokenizer = [] {
    const char* path = std::getenv("THERMOCLINE_FUZZ_MODEL");
    if (path == nullptr) {
      std::fprintf(stderr, "set THERMOCLINE_FUZZ_MODEL to a GGUF model (stories260K.gguf)\n");
      std::abort();
    }
    auto file = GgufFile::Open(path);
    if (!file.ok()) {
      std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
      std::abort();
    }
    auto tok = Tokenizer::FromGguf(**file);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
      std::abort();
    }
    return new Tokenizer(*std::move(tok));  // lives for the process
  }();
  return *tokenizer;
}

}  // namespace thermocline::fuzz
