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

// One buffer on its own mapping, freed with it, for memory a token reads a row here and a row
// there: the transposed copies of the sparse products (sparsity/neuron_ffn.h), of which a model
// has a few per layer, some transient; the predictors' fc2_t; the KV cache. It starts on a 2 MiB
// boundary and asks for huge pages over its whole 2 MiB units only, so a buffer's tail stays on
// 4 KiB pages instead of rounding every copy up to a huge page (an arena's chunks would pool
// them, but also keep a transient copy's memory alive). Pages are committed as they are first
// touched.
class PageBuffer {
 public:
  PageBuffer() = default;
  // `bytes` of zeroed memory; data() is nullptr if the system has no memory left.
  explicit PageBuffer(size_t bytes);
  ~PageBuffer();
  PageBuffer(PageBuffer&& other) noexcept;
  PageBuffer& operator=(PageBuffer&& other) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Bytes advised for huge pages (the whole 2 MiB units; 0 when huge pages are not wanted).
  size_t huge_bytes() const { return huge_; }

 private:
  void Release();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  size_t huge_ = 0;
};

}  // namespace thermocline
