// TimeScatteredRead (the benchmarks' floor for gathered rows) reads exactly the chosen rows:
// its checksum equals the sum of those rows' words and trailing bytes, for row sizes that are
// not multiples of its 32-byte steps, id counts that leave partial lockstep groups and shares
// smaller than one group, with and without prefetching, on 1 to 3 threads. Run under
// AddressSanitizer too (an _asan_test): the rows sit at the very end of an exactly-sized heap
// block, so a read past a row is reported.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "shared/util/membw.h"
#include "shared/util/thread_pool.h"

namespace thermocline {
namespace {

uint64_t ReferenceSum(const uint8_t* row, int64_t bytes) {
  uint64_t sum = 0;
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v;
    std::memcpy(&v, row + i, sizeof v);
    sum += v;
  }
  for (; i < bytes; ++i) sum += row[i];
  return sum;
}

TEST(MembwTest, ScatteredReadReadsExactlyTheChosenRows) {
  std::mt19937 rng(11);
  for (int64_t row_bytes : {1, 7, 8, 31, 33, 100, 1152, 3096}) {
    constexpr int64_t kRows = 61;
    std::vector<uint8_t> rows(static_cast<size_t>(kRows * row_bytes));
    for (uint8_t& b : rows) b = static_cast<uint8_t>(rng());
    for (int64_t n_ids : {0, 1, 7, 8, 9, 17, 61}) {
      // Sorted, distinct, always including the last row (the end of the heap block).
      std::vector<int32_t> ids;
      for (int64_t r = kRows - n_ids; r < kRows; ++r) ids.push_back(static_cast<int32_t>(r));
      if (n_ids == 9) {
        ids = {0, 3, 4, 10, 22, 23, 40, 59, 60};
      }
      uint64_t want = 0;
      for (int32_t id : ids) want += ReferenceSum(rows.data() + id * row_bytes, row_bytes);
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t ahead : {int64_t{0}, int64_t{64}, int64_t{32} << 10}) {
          uint64_t got = ~uint64_t{0};
          const double seconds = TimeScatteredRead(pool, rows.data(), row_bytes, ids.data(),
                                                   static_cast<int64_t>(ids.size()), ahead, &got);
          EXPECT_GE(seconds, 0.0);
          EXPECT_EQ(got, want) << "row_bytes " << row_bytes << ", " << ids.size() << " ids, "
                               << threads << " threads, ahead " << ahead;
        }
      }
    }
  }
}

}  // namespace
}  // namespace thermocline
