// Small pieces the benchmarks share: buffers for the weight copies, seconds between two clock
// readings, the median of a sample, the dense-decode model, comma-separated flag lists (the
// --threads list among them), and the machine's load to print beside results.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "shared/model/model.h"
#include "shared/util/cpu_features.h"
#include "shared/util/load_average.h"
#include "shared/util/page_arena.h"

namespace thermocline::bench {

// Weight copies held as the product holds what it streams (its interleaved copies, transposed
// copies and KV cache): on huge pages where whole ones fit (util/page_arena.h), so that a
// kernel's TLB misses are the product's. Page-aligned (the floor reads use aligned vector
// loads); data() is nullptr if there is no memory.
using Buffer = PageBuffer;

inline Buffer Allocate(size_t bytes) { return Buffer(bytes); }

inline double Seconds(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// 0 for an empty sample (e.g. no axpy rounds with a single copy).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The kernel family the run uses, "+amx" where the avx512 family's Q4_0 GEMM runs on AMX tiles.
inline const char* KernelFamily() {
  const SimdLevel level = DetectSimdLevel();
  if (level == SimdLevel::kAvx512 && AmxInt8Usable()) return "avx512+amx";
  return SimdLevelName(level);
}

// A model as the product's dense decode holds it (thermocline generate --sparsity dense): loaded,
// its dense FFN multiplied from the interleaved copies (Model::InterleaveDenseFfn;
// THERMOCLINE_REPACK=0 keeps the row layout).
inline absl::StatusOr<std::unique_ptr<Model>> LoadForDenseDecode(const std::string& path) {
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(path);
  if (!model.ok()) return model.status();
  if (absl::Status s = (*model)->InterleaveDenseFfn(); !s.ok()) return s;
  return model;
}

// A comma-separated flag value such as "1,2" or "0.05,0.5" (T: an integer type or double):
// every entry a number `ok` accepts. False (and `out` unspecified) for anything else, an empty
// value included.
template <class T, class Ok>
bool ParseList(std::string_view text, std::vector<T>& out, Ok ok) {
  out.clear();
  for (absl::string_view part : absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    T v{};
    bool parsed = false;
    if constexpr (std::is_same_v<T, double>) {
      parsed = absl::SimpleAtod(part, &v);
    } else {
      parsed = absl::SimpleAtoi(part, &v);
    }
    if (!parsed || !ok(v)) return false;
    out.push_back(v);
  }
  return !out.empty();
}

// A --threads value such as "1,2": every entry a positive count.
inline bool ParseThreadList(const char* text, std::vector<int>& out) {
  return ParseList(text, out, [](int t) { return t > 0; });
}

// "1-minute average/runnable now", e.g. "3.52/5".
inline std::string LoadNow() {
  absl::StatusOr<LoadAverage> l = ReadLoadAverage();
  if (!l.ok()) return "?";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f/%d", l->one, l->runnable);
  return buf;
}

}  // namespace thermocline::bench
