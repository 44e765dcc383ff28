// libFuzzer target: stories260K's tokenizer on arbitrary input. The first byte picks a mode:
//   even: the rest is text. Encode must give ids in range (BOS first when asked), and the
//         round trip must hold: for printable UTF-8 text, Decode(Encode(text)) == text, with
//         the dummy-prefix space in front when there is no BOS (the
//         tokenizer's byte fallback covers every byte, so nothing may be lost or invented);
//         for any bytes, Decode's output is valid UTF-8.
//   odd:  the rest is little-endian int32 ids, any value. Decode must not crash, must give
//         valid UTF-8 and must equal a StreamingDetokenizer fed the same ids and flushed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gateway/validate.h"
#include "tests/fuzz/fuzz_model.h"

using thermocline::gateway::IsValidUtf8;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const thermocline::Tokenizer& tok = thermocline::fuzz::ModelTokenizer();
  const uint8_t mode = data[0];
  ++data;
  --size;
  if (mode % 2 == 0) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const bool bos = (mode & 2) != 0;
    const std::vector<int32_t> ids = tok.Encode(text, bos);
    if (bos && (ids.empty() || ids[0] != tok.bos())) std::abort();
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size()) std::abort();
    }
    const std::string back = tok.Decode(ids);
    if (!IsValidUtf8(back)) std::abort();
    // Control characters, leading spaces and U+2581 are where SentencePiece normalizes, so
    // the exact round trip is asserted on text without them.
    bool plain = IsValidUtf8(text) && !text.empty() && text[0] != ' ';
    for (unsigned char c : text) plain = plain && c >= 0x20 && c != 0x7f;
    // U+2581 is SentencePiece's own encoding of a space; it decodes as one.
    plain = plain && text.find("\xe2\x96\x81") == std::string::npos;
    // Without BOS nothing marks the start, so the dummy prefix comes back as a leading space.
    const std::string expect = bos ? text : " " + text;
    if (plain && back != expect) {
      std::fprintf(stderr, "round trip lost text: %zu bytes in, %zu out\n", text.size(),
                   back.size());
      std::abort();
    }
    return 0;
  }
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  const std::string text = tok.Decode(ids);
  if (!IsValidUtf8(text)) std::abort();
  thermocline::StreamingDetokenizer stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.Push(id);
  streamed += stream.Flush();
  if (streamed != text) std::abort();
  return 0;
}
