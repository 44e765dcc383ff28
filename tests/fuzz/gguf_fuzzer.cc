// libFuzzer target: the GGUF reader on arbitrary bytes (GgufFile::FromBuffer parses the same
// way Open does after mapping). Whatever the bytes, parsing ends in a status, never a crash,
// and a file that parses keeps every promise its accessors make: each tensor's bytes lie
// inside the buffer, typed lookups agree with FindValue, and a tokenizer built from it (the
// next thing a model load does) also fails cleanly or yields ids that decode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "shared/gguf/gguf.h"
#include "shared/tokenizer/tokenizer.h"

using thermocline::GgufFile;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = GgufFile::FromBuffer(data, size);
  if (!file.ok()) return 0;
  const GgufFile& f = **file;
  if (f.data_offset() > size) std::abort();
  for (const auto& t : f.tensors()) {
    // The reader promised these bytes are in the image: touch the first and the last.
    if (t.n_bytes < 0) std::abort();
    if (t.n_bytes > 0) {
      if (t.data < data || t.data + t.n_bytes > data + size) std::abort();
      volatile uint8_t first = t.data[0], last = t.data[t.n_bytes - 1];
      (void)first;
      (void)last;
    }
    if (f.FindTensor(t.name) == nullptr) std::abort();
  }
  for (const auto& [key, value] : f.metadata()) {
    if (f.FindValue(key) == nullptr) std::abort();
    (void)f.GetInt(key);
    (void)f.GetDouble(key);
    (void)f.GetString(key);
    (void)f.GetArray(key);
  }
  auto tok = thermocline::Tokenizer::FromGguf(f);
  if (tok.ok()) {
    const std::vector<int32_t> ids = tok->Encode("Once upon a time", true);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    }
    (void)tok->Decode(ids);
  }
  return 0;
}
