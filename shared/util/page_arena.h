// Memory for large, long-lived copies that are streamed whole (the models' interleaved weight
// copies): anonymous mappings in 2 MiB-aligned chunks that ask the kernel for transparent huge
// pages (madvise MADV_HUGEPAGE, which is all Linux's default "madvise" mode needs). Huge pages
// take the TLB misses out of a stream through hundreds of MiB: one miss per 2 MiB instead of one
// per 4 KiB page.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace thermocline {

// False when THERMOCLINE_HUGEPAGES=0 is in the environment (for A/B runs): then neither the
// arena nor the model file's mapping asks for huge pages.
bool HugePagesWanted();

class PageArena {
 public:
  // Pieces are cut from chunks of at least this much; a larger piece gets a chunk of its own.
  static constexpr size_t kChunkBytes = size_t{64} << 20;

  PageArena() = default;
  ~PageArena();
  PageArena(const PageArena&) = delete;
  PageArena& operator=(const PageArena&) = delete;

  // `bytes` of zeroed memory, 64-byte aligned, valid until the arena is destroyed; nullptr if
  // the system has no memory left.
  uint8_t* Allocate(size_t bytes);

  // Bytes handed out, and bytes mapped for them.
  size_t allocated_bytes() const { return allocated_; }
  size_t mapped_bytes() const;

 private:
  struct Chunk {
    uint8_t* base;
    size_t size;
    size_t used;
  };
  std::vector<Chunk> chunks_;
  size_t allocated_ = 0;
};

}  // namespace thermocline
