#include "shared/util/page_arena.h"

#include <sys/mman.h>

#include "shared/util/env_switches.h"

namespace thermocline {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `size` bytes (whole 4 KiB pages) of zeroed anonymous memory starting on a 2 MiB boundary (a
// huge page needs an aligned virtual range): over-mapped by a huge page, the slack on either
// side returned. nullptr if there is no memory.
uint8_t* MapAligned(size_t size, int extra_flags) {
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + size + kHugePage;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  return reinterpret_cast<uint8_t*>(aligned);
}

}  // namespace

bool HugePagesWanted() {
  static const bool wanted = EnvSwitchOn(EnvSwitch::kHugePages);
  return wanted;
}

PageArena::~PageArena() {
  for (const Chunk& c : chunks_) munmap(c.base, c.size);
}

uint8_t* PageArena::Allocate(size_t bytes) {
  const size_t need = RoundUp(bytes == 0 ? 1 : bytes, 64);
  if (chunks_.empty() || chunks_.back().size - chunks_.back().used < need) {
    const size_t size = RoundUp(need > kChunkBytes ? need : kChunkBytes, kHugePage);
    uint8_t* base = MapAligned(size, MAP_NORESERVE);
    if (base == nullptr) return nullptr;
    // Advice only: where the kernel has no huge pages the chunk simply stays on 4 KiB pages.
    if (HugePagesWanted()) madvise(base, size, MADV_HUGEPAGE);
    chunks_.push_back({base, size, 0});
  }
  Chunk& c = chunks_.back();
  uint8_t* p = c.base + c.used;
  c.used += need;
  allocated_ += bytes;
  return p;
}

size_t PageArena::mapped_bytes() const {
  size_t total = 0;
  for (const Chunk& c : chunks_) total += c.size;
  return total;
}

PageBuffer::PageBuffer(size_t bytes) {
  if (bytes == 0) return;
  const size_t size = RoundUp(bytes, 4096);
  data_ = MapAligned(size, 0);
  if (data_ == nullptr) return;
  size_ = bytes;
  mapped_ = size;
  // Advice only, as in PageArena; the tail past the last whole huge page is left out.
  const size_t huge = HugePagesWanted() ? size / kHugePage * kHugePage : 0;
  if (huge > 0 && madvise(data_, huge, MADV_HUGEPAGE) == 0) huge_ = huge;
}

PageBuffer::~PageBuffer() { Release(); }

PageBuffer::PageBuffer(PageBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), mapped_(other.mapped_), huge_(other.huge_) {
  other.data_ = nullptr;
  other.size_ = other.mapped_ = other.huge_ = 0;
}

PageBuffer& PageBuffer::operator=(PageBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = other.data_;
    size_ = other.size_;
    mapped_ = other.mapped_;
    huge_ = other.huge_;
    other.data_ = nullptr;
    other.size_ = other.mapped_ = other.huge_ = 0;
  }
  return *this;
}

void PageBuffer::Release() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = huge_ = 0;
}

}  // namespace thermocline
