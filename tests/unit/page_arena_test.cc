// PageArena: pieces are zeroed, 64-byte aligned, disjoint and writable; chunks are 2 MiB aligned
// (what a huge page needs); a piece larger than a chunk gets its own. PageBuffer: the same for
// one buffer of its own, huge pages over its whole 2 MiB units only.
#include "shared/util/page_arena.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace thermocline {
namespace {

TEST(PageArenaTest, PiecesAreZeroedAlignedAndDisjoint) {
  PageArena arena;
  std::vector<std::pair<uint8_t*, size_t>> pieces;
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{4097}, size_t{3} << 20,
                       PageArena::kChunkBytes + 5, size_t{100}}) {
    uint8_t* p = arena.Allocate(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    for (size_t i = 0; i < bytes; i += 4096) ASSERT_EQ(p[i], 0) << bytes;
    EXPECT_EQ(p[bytes - 1], 0);
    std::memset(p, static_cast<int>(pieces.size() + 1), bytes);
    pieces.emplace_back(p, bytes);
  }
  // Every piece still holds its own fill: none overlaps another.
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto [p, bytes] = pieces[k];
    EXPECT_EQ(p[0], static_cast<uint8_t>(k + 1));
    EXPECT_EQ(p[bytes - 1], static_cast<uint8_t>(k + 1));
  }
  size_t total = 0;
  for (const auto& piece : pieces) total += piece.second;
  EXPECT_EQ(arena.allocated_bytes(), total);
  // The large piece took a chunk of its own, beside the shared one(s).
  EXPECT_GE(arena.mapped_bytes(), total);
  EXPECT_GE(arena.mapped_bytes(), PageArena::kChunkBytes + (size_t{2} << 20));
}

TEST(PageArenaTest, ChunksStartOnHugePageBoundaries) {
  PageArena arena;
  uint8_t* first = arena.Allocate(10);
  uint8_t* big = arena.Allocate(PageArena::kChunkBytes);  // does not fit beside `first`
  ASSERT_NE(first, nullptr);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (size_t{2} << 20), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % (size_t{2} << 20), 0u);
}

// Sizes under, at and over whole huge pages: zeroed and writable end to end, whole 2 MiB units
// advised (when wanted) from a 2 MiB boundary, the tail not; moves hand the mapping over.
TEST(PageBufferTest, ZeroedWritableAndHugeOverWholeUnitsOnly) {
  constexpr size_t kHuge = size_t{2} << 20;
  for (size_t bytes : {size_t{1}, size_t{4097}, kHuge - 1, kHuge, 2 * kHuge + 12345}) {
    PageBuffer b(bytes);
    ASSERT_NE(b.data(), nullptr) << bytes;
    EXPECT_EQ(b.size(), bytes);
    EXPECT_EQ(b.data()[0], 0);
    EXPECT_EQ(b.data()[bytes - 1], 0);
    std::memset(b.data(), 0xAB, bytes);
    EXPECT_EQ(b.data()[bytes - 1], 0xAB);
    // The mapping is whole 4 KiB pages, so kHuge - 1 bytes fill one huge page.
    const size_t whole = (bytes + 4095) / 4096 * 4096 / kHuge * kHuge;
    EXPECT_EQ(b.huge_bytes(), HugePagesWanted() ? whole : 0) << bytes;
    if (b.huge_bytes() > 0) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kHuge, 0u);
    }
    uint8_t* data = b.data();
    PageBuffer moved(std::move(b));
    EXPECT_EQ(moved.data(), data);
    EXPECT_EQ(moved.size(), bytes);
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_EQ(b.size(), 0u);
    PageBuffer assigned(16);
    assigned = std::move(moved);
    EXPECT_EQ(assigned.data(), data);
    EXPECT_EQ(assigned.data()[bytes - 1], 0xAB);
  }
  PageBuffer empty(0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
}

}  // namespace
}  // namespace thermocline
