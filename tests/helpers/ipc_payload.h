// Deterministic message streams for the ipc tests and their peer process: message i of the
// stream `seed` has a size and bytes both sides compute independently, and carries a checksum
// of itself, so a torn, reordered, duplicated or foreign message is caught.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace thermocline::ipc::testing {

inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Mostly small messages, sometimes up to max_bytes, sometimes exactly 0 or max_bytes.
inline uint64_t StreamMessageSize(uint64_t seed, uint64_t i, uint64_t max_bytes) {
  uint64_t r = Mix64(seed * 0x100000001b3ull + i);
  switch (r % 16) {
    case 0:
      return 0;
    case 1:
      return max_bytes;
    case 2:
    case 3:
      return (r >> 8) % (max_bytes + 1);
    default:
      return (r >> 8) % (std::min<uint64_t>(max_bytes, 512) + 1);
  }
}

inline uint64_t Fnv1a(const std::byte* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 0x100000001b3ull;
  return h;
}

// Bytes [8, n) from the stream; bytes [0, 8) (when n >= 8) the checksum of the rest mixed with
// i, so even a message whose bytes are internally consistent but belong elsewhere is caught.
inline void FillStreamMessage(uint64_t seed, uint64_t i, absl::Span<std::byte> out) {
  const size_t n = out.size();
  const uint64_t base = Mix64(seed ^ Mix64(i));
  for (size_t j = (n >= 8 ? 8 : 0); j < n; j += 8) {
    uint64_t w = Mix64(base + j);
    std::memcpy(out.data() + j, &w, std::min<size_t>(8, n - j));
  }
  if (n >= 8) {
    uint64_t sum = Fnv1a(out.data() + 8, n - 8) ^ i;
    std::memcpy(out.data(), &sum, 8);
  }
}

// "" when `got` is message i of the stream, else what is wrong.
inline std::string CheckStreamMessage(uint64_t seed, uint64_t i, uint64_t max_bytes,
                                      absl::Span<const std::byte> got) {
  const uint64_t size = StreamMessageSize(seed, i, max_bytes);
  if (got.size() != size)
    return absl::StrCat("message ", i, ": ", got.size(), " bytes, want ", size);
  if (size >= 8) {
    uint64_t sum;
    std::memcpy(&sum, got.data(), 8);
    if (sum != (Fnv1a(got.data() + 8, size - 8) ^ i)) {
      return absl::StrCat("message ", i, ": checksum mismatch (torn or foreign payload)");
    }
  }
  std::string want(size, '\0');
  FillStreamMessage(seed, i,
                    absl::Span<std::byte>(reinterpret_cast<std::byte*>(want.data()), size));
  if (size > 0 && std::memcmp(want.data(), got.data(), size) != 0) {
    return absl::StrCat("message ", i, ": content differs from the stream");
  }
  return "";
}

}  // namespace thermocline::ipc::testing
