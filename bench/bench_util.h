// Small pieces the benchmarks share: buffers for the weight copies, seconds between two clock
// readings, the median of a sample, the dense-decode model, the --threads list, and the
// machine's load to print beside results.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
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

// A --threads value such as "1,2": every entry a positive count. False (and `out` unspecified)
// for anything else.
inline bool ParseThreadList(const char* text, std::vector<int>& out) {
  out.clear();
  for (auto part : absl::StrSplit(text, ',')) {
    int t = 0;
    if (!absl::SimpleAtoi(part, &t) || t <= 0) return false;
    out.push_back(t);
  }
  return true;
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
