// GEMV (decode) and small-GEMM (prompt) throughput of MatMul for every weight type, reported
// against the memory read bandwidth measured in the same run: a decode step streams every
// weight byte once per token, so GB/s of weights read / read bandwidth is the figure of merit.
//
//   gemv_bench [--threads=1,2] [--working_set_mib=1024] [--rounds=4] [--types=f16,q8_0]
//              [--cols=4096] [--matrix_mib=64] [--gemm_tokens=64] [--sparse_fraction=0.25]
//
// Types q4_0x8, q5_0x8, q8_0x8, q3_Kx8, q4_Kx8, q5_Kx8, q6_Kx8 and iq4_xsx8 are those types with
// the 8-row interleaved copy that the model makes at load for its dense-only matrices
// (shared/gguf/interleaved8.h): their GEMV and GEMM read that copy, their sparse kernels the row
// layout as always. GB/s counts the row layout's bytes (the weights' size in the file; the Q4_K
// and Q5_K copies are 2.8% and 2.3% larger). With the row type in the same run the ratio of the
// two is printed.
//
// Each type gets copies of one matrix adding up to the working set, and successive GEMVs walk
// through them like the layers of a model, so the weights come from DRAM, not from the
// last-level cache (which is larger than one matrix on current server parts).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_util.h"
#include "shared/kernels/matmul.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/interleaved8.h"
#include "shared/gguf/quant.h"
#include "shared/util/cpu_features.h"
#include "shared/util/membw.h"
#include "shared/util/thread_pool.h"

namespace thermocline {
namespace {

// A weight type, and for types with an interleaved layout whether the GEMVs read it.
struct BenchType {
  GgmlType type;
  bool interleaved = false;
  std::string name() const {
    return std::string(TypeTraits(type).name) + (interleaved ? "x8" : "");
  }
};

struct Options {
  std::vector<int> threads = {1, 2};
  int64_t working_set_mib = 1024;
  int rounds = 4;
  std::vector<BenchType> types = {{GgmlType::kF32},  {GgmlType::kF16},  {GgmlType::kBF16},
                                  {GgmlType::kQ8_0}, {GgmlType::kQ8_0, true},
                                  {GgmlType::kQ4_0}, {GgmlType::kQ4_0, true},
                                  {GgmlType::kQ5_0}, {GgmlType::kQ5_0, true},
                                  {GgmlType::kQ4_K}, {GgmlType::kQ4_K, true},
                                  {GgmlType::kQ5_K}, {GgmlType::kQ5_K, true},
                                  {GgmlType::kQ6_K}, {GgmlType::kQ6_K, true},
                                  {GgmlType::kIQ4_XS}};
  int64_t cols = 4096;
  int64_t matrix_mib = 64;
  int64_t gemm_tokens = 64;
  double sparse_fraction = 0.25;
};

bool IsMatrixType(GgmlType t) { return IsWeightType(t); }

std::vector<std::string_view> Split(std::string_view s) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    out.push_back(s.substr(0, comma));
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

bool ParseFlags(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    const size_t eq = a.find('=');
    if (a.substr(0, 2) != "--" || eq == std::string_view::npos) return false;
    const std::string_view key = a.substr(2, eq - 2);
    const std::string value(a.substr(eq + 1));
    if (key == "threads") {
      o.threads.clear();
      for (std::string_view t : Split(value))
        o.threads.push_back(std::atoi(std::string(t).c_str()));
    } else if (key == "types") {
      o.types.clear();
      for (std::string_view t : Split(value)) {
        if (t.size() > 2 && t.substr(t.size() - 2) == "x8") {
          auto type = TypeFromName(t.substr(0, t.size() - 2));
          if (!type || !HasInterleaved8Layout(*type)) return false;
          o.types.push_back({*type, true});
          continue;
        }
        auto type = TypeFromName(t);
        if (!type || !IsMatrixType(*type)) return false;
        o.types.push_back({*type});
      }
    } else if (key == "working_set_mib") {
      o.working_set_mib = std::atoll(value.c_str());
    } else if (key == "rounds") {
      o.rounds = std::atoi(value.c_str());
    } else if (key == "cols") {
      o.cols = std::atoll(value.c_str());
    } else if (key == "matrix_mib") {
      o.matrix_mib = std::atoll(value.c_str());
    } else if (key == "gemm_tokens") {
      o.gemm_tokens = std::atoll(value.c_str());
    } else if (key == "sparse_fraction") {
      o.sparse_fraction = std::atof(value.c_str());
    } else {
      return false;
    }
  }
  for (int t : o.threads) {
    if (t < 1) return false;
  }
  for (const BenchType& t : o.types) {
    if (o.cols % TypeTraits(t.type).block_size != 0) return false;
  }
  // Any width the types allow (float types: ragged ends too, e.g. the predictors' 257 columns).
  return o.rounds >= 1 && o.cols >= 8 && o.matrix_mib >= 1 &&
         o.gemm_tokens >= 1 && o.sparse_fraction > 0 && o.sparse_fraction <= 1 &&
         !o.types.empty() && !o.threads.empty();
}

using bench::Allocate;
using bench::Buffer;
using bench::Median;
using bench::Seconds;

// One quantized matrix replicated to fill the working set. Content does not affect speed, so
// a few hundred distinct random rows are quantized and tiled over the rows.
struct Weights {
  std::vector<Buffer> copies;
  std::vector<Buffer> interleaved;  // the x8 types: each copy interleaved
  MatrixView view;  // of copies[0] (and interleaved[0])
  int64_t bytes = 0;
  // The view of copy k, as the GEMVs read it.
  MatrixView Copy(size_t k) const {
    MatrixView v = view;
    v.data = copies[k].data();
    if (!interleaved.empty()) v.interleaved = interleaved[k].data();
    return v;
  }
};

Weights MakeWeights(BenchType bench_type, const Options& o) {
  const GgmlType type = bench_type.type;
  Weights w;
  const int64_t row_bytes = RowBytes(type, o.cols);
  int64_t rows = ((o.matrix_mib << 20) + row_bytes - 1) / row_bytes;
  rows = (rows + 15) / 16 * 16;
  w.bytes = rows * row_bytes;
  constexpr int64_t kDistinctRows = 256;
  std::vector<uint8_t> distinct(kDistinctRows * row_bytes);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> src(o.cols);
  // Types without a quantizer get random bytes in [0x10, 0x3b]: any two of them form a normal
  // fp16 scale between 2^-11 and 2^-1 (no subnormal or infinite values, which could slow the
  // float units), and the quants take every pattern the decoders see.
  std::uniform_int_distribution<int> byte(0x10, 0x3b);
  for (int64_t r = 0; r < kDistinctRows; ++r) {
    if (HasQuantizer(type)) {
      for (float& f : src) f = normal(rng);
      QuantizeRow(type, src.data(), distinct.data() + r * row_bytes, o.cols);
    } else {
      for (int64_t i = 0; i < row_bytes; ++i) {
        distinct[r * row_bytes + i] = static_cast<uint8_t>(byte(rng));
      }
    }
  }
  const int64_t n_copies =
      std::max<int64_t>(1, ((o.working_set_mib << 20) + w.bytes - 1) / w.bytes);
  for (int64_t k = 0; k < n_copies; ++k) {
    Buffer b = Allocate(w.bytes);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(b.data() + r * row_bytes, distinct.data() + (r % kDistinctRows) * row_bytes,
                  row_bytes);
    }
    if (bench_type.interleaved) {
      Buffer q = Allocate(Interleaved8Bytes(type, rows, o.cols));
      Interleave8(type, b.data(), row_bytes, rows, o.cols, q.data());
      w.interleaved.push_back(std::move(q));
    }
    w.copies.push_back(std::move(b));
  }
  w.view = MatrixView{type, rows, o.cols, w.copies[0].data(), row_bytes};
  if (!w.interleaved.empty()) w.view.interleaved = w.interleaved[0].data();
  return w;
}

struct GemvResult {
  double gemv_best_s = 0, gemv_median_s = 0;  // one GEMV
  double read_best_s = 0, read_median_s = 0;  // a plain parallel read of one matrix copy
  // Median over (GEMV, the read right after it) pairs of read time / GEMV time: the two sides
  // of a pair run milliseconds apart under the same load, so on a shared machine this is the
  // steadiest of the three ratios.
  double paired_ratio = 0;
};

// GEMVs through the copies, each followed by a plain read of the copy half the working set
// away, so kernel and floor are timed on the same bytes under the same (noisy) conditions and
// neither finds the other's data in the cache.
GemvResult TimeGemv(const Weights& w, const std::vector<float>& x, std::vector<float>& y,
                    int rounds, ThreadPool& pool) {
  const size_t n = w.copies.size();
  auto gemv = [&](size_t k) {
    const MatrixView v = w.Copy(k);
    MatMul(v, x.data(), 1, v.cols, y.data(), v.rows, pool);
  };
  for (size_t k = 0; k < n; ++k) gemv(k);  // warm up: page tables, thread wakeup
  std::vector<double> gemv_s, read_s, pairs;
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < n; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      gemv(k);
      gemv_s.push_back(Seconds(t0, std::chrono::steady_clock::now()));
      read_s.push_back(TimeParallelRead(pool, w.copies[(k + n / 2) % n].data(), w.bytes));
      pairs.push_back(read_s.back() / gemv_s.back());
    }
  }
  return {*std::min_element(gemv_s.begin(), gemv_s.end()), Median(gemv_s),
          *std::min_element(read_s.begin(), read_s.end()), Median(read_s), Median(pairs)};
}

struct SparseResult {
  double gather_best_s = 0, axpy_best_s = 0;
  double read_best_s = 0;                     // a plain read of as many contiguous bytes
  double scatter_best_s = 0;                  // a plain read of the same rows (same ids)
  double gather_paired = 0, axpy_paired = 0;  // median of read time / kernel time per pair
  int64_t bytes = 0;                          // weight bytes one call reads
};

// The sparse FFN's two kernels over a random sorted fraction of the rows (the active neurons),
// through the copies like the GEMVs. After each call a plain read of as many contiguous bytes of
// a far copy is timed (the floor for these short calls, under the same conditions), then a plain
// read of the same rows of another copy with the kernels' prefetch distance (TimeScatteredRead:
// the floor of the access pattern itself; scatter_read_bench), and a full read of another copy
// makes sure the same ids never find their rows still in the cache.
SparseResult TimeSparse(const Weights& w, double fraction, int rounds, ThreadPool& pool) {
  const int64_t rows = w.view.rows;
  std::vector<int32_t> ids;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (u(rng) < fraction) ids.push_back(static_cast<int32_t>(r));
  }
  if (ids.empty()) ids.push_back(0);
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t bytes = n * w.view.row_bytes;
  std::vector<float> x(w.view.cols, 0.5f), y(n), coeffs(n, 0.25f), acc(w.view.cols, 0.0f);
  MatrixView v = w.view;
  v.interleaved = nullptr;  // never read by the sparse kernels anyway
  double gather = 1e30, axpy = 1e30, read = 1e30, scatter = 1e30;
  std::vector<double> gather_pairs, axpy_pairs;
  const size_t n_copies = w.copies.size();
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < n_copies; ++k) {
      v.data = w.copies[k].data();
      const auto t0 = std::chrono::steady_clock::now();
      if (k % 2 == 0) {
        GatherMatMul(v, ids.data(), n, x.data(), y.data(), pool);
      } else {
        AxpyRows(v, ids.data(), coeffs.data(), n, acc.data(), pool);
      }
      const double t = Seconds(t0, std::chrono::steady_clock::now());
      const uint8_t* far = w.copies[(k + n_copies / 2) % n_copies].data();
      const double r = TimeParallelRead(pool, far, bytes);
      read = std::min(read, r);
      scatter = std::min(scatter,
                         TimeScatteredRead(pool, w.copies[(k + n_copies / 3) % n_copies].data(),
                                           v.row_bytes, ids.data(), n, kGatherPrefetchAheadBytes));
      if (k % 2 == 0) {
        gather = std::min(gather, t);
        gather_pairs.push_back(r / t);
      } else {
        axpy = std::min(axpy, t);
        axpy_pairs.push_back(r / t);
      }
      TimeParallelRead(pool, w.copies[(k + n_copies / 4) % n_copies].data(), w.bytes);
    }
  }
  return {gather, axpy, read, scatter, Median(gather_pairs), Median(axpy_pairs), bytes};
}

// The kernel's own ceiling per thread: best single-thread GEMV over the first ~256 KiB of rows of
// one copy (they stay in L2 after the first pass), in GB/s of weights. One thread because a
// multi-thread call this short measures the pool's wake-up on a busy machine, not the kernel.
// Where threads x this is below the read floor the GEMV is compute-bound: no prefetching can
// bring it closer to the floor than that ratio.
double TimeInCache(const Weights& w, const std::vector<float>& x, std::vector<float>& y) {
  ThreadPool pool(1);
  MatrixView v = w.view;
  v.rows = std::min<int64_t>(v.rows, std::max<int64_t>(16, (int64_t{256} << 10) / v.row_bytes));
  double best = 1e30;
  for (int rep = 0; rep < 200; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    MatMul(v, x.data(), 1, v.cols, y.data(), v.rows, pool);
    best = std::min(best, Seconds(t0, std::chrono::steady_clock::now()));
  }
  return static_cast<double>(v.rows * v.row_bytes) / best / 1e9;
}

// Best of a few runs of one n_tokens-wide MatMul, in GFLOP/s (2 flops per weight x token).
double TimeGemm(const Weights& w, int64_t n_tokens, ThreadPool& pool) {
  std::vector<float> x(n_tokens * w.view.cols), y(n_tokens * w.view.rows);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& f : x) f = normal(rng);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    MatMul(w.view, x.data(), n_tokens, w.view.cols, y.data(), w.view.rows, pool);
    best = std::min(best, Seconds(t0, std::chrono::steady_clock::now()));
  }
  return 2.0 * static_cast<double>(w.view.rows) * w.view.cols * n_tokens / best / 1e9;
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseFlags(argc, argv, o)) {
    std::fprintf(
        stderr,
        "usage: gemv_bench [--threads=1,2] [--working_set_mib=1024] [--rounds=4]\n"
        "                  [--types=f32,f16,bf16,q8_0,q4_0,q4_K,...] [--cols=4096]\n"
        "                  [--matrix_mib=64] [--gemm_tokens=64] [--sparse_fraction=0.25]\n");
    return 2;
  }
  std::printf("gemv_bench: kernels=%s, working set %lld MiB per type, %d rounds\n",
              bench::KernelFamily(), static_cast<long long>(o.working_set_mib),
              o.rounds);
  std::vector<double> floor_gbs;
  for (int n : o.threads) {
    ThreadPool pool(n);
    floor_gbs.push_back(
        MeasureReadBandwidthGBs(pool, static_cast<size_t>(o.working_set_mib) << 20));
    std::printf("hardware floor: read bandwidth %.1f GB/s with %d thread(s)\n", floor_gbs.back(),
                n);
  }
  std::printf("\n%-6s %13s %4s %3s %8s %8s %7s %7s %7s %7s %7s %7s %7s %9s\n", "type",
              "rows x cols", "MiB", "thr", "best ms", "med ms", "GB/s", "read", "best", "median",
              "paired", "in L2", "ceiling", "GEMM");
  std::printf("%-6s %13s %4s %3s %8s %8s %7s %7s %7s %7s %7s %7s %7s %9s\n", "", "", "", "",
              "GEMV", "GEMV", "GEMV", "GB/s", "ratio", "ratio", "ratio", "GB/s", "ratio",
              "GFLOP/s");
  std::vector<float> x(o.cols);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& f : x) f = normal(rng);
  std::vector<std::string> sparse_lines;
  // GEMV GB/s and GEMM GFLOP/s per thread count of each type with an interleaved layout, in
  // the row layout and interleaved, for the ratio lines.
  struct Pair {
    GgmlType type;
    std::vector<double> row_gemv, row_gemm, x8_gemv, x8_gemm;
  };
  std::vector<Pair> pairs;
  for (const BenchType& bench_type : o.types) {
    const GgmlType t = bench_type.type;
    if (!HasInterleaved8Layout(t) ||
        std::any_of(pairs.begin(), pairs.end(), [&](const Pair& p) { return p.type == t; })) {
      continue;
    }
    const size_t n = o.threads.size();
    pairs.push_back({t, std::vector<double>(n), std::vector<double>(n), std::vector<double>(n),
                     std::vector<double>(n)});
  }
  for (const BenchType& bench_type : o.types) {
    const GgmlType type = bench_type.type;
    const std::string name = bench_type.name();
    const Weights w = MakeWeights(bench_type, o);
    std::vector<float> y(w.view.rows);
    for (size_t i = 0; i < o.threads.size(); ++i) {
      ThreadPool pool(o.threads[i]);
      const GemvResult g = TimeGemv(w, x, y, o.rounds, pool);
      const double gemm = TimeGemm(w, o.gemm_tokens, pool);
      const double in_cache = TimeInCache(w, x, y);
      const SparseResult sp = TimeSparse(w, o.sparse_fraction, o.rounds, pool);
      char line[256];
      std::snprintf(
          line, sizeof line,
          "%-6s %3d %8lld %7.1f %7.1f %7.1f %6.0f%% %6.0f%% %6.0f%% %7.1f %6.0f%% %6.0f%% %6.0f%%",
          name.c_str(), o.threads[i], static_cast<long long>(sp.bytes / w.view.row_bytes),
          sp.bytes / sp.read_best_s / 1e9, sp.bytes / sp.scatter_best_s / 1e9,
          sp.bytes / sp.gather_best_s / 1e9, 100.0 * sp.read_best_s / sp.gather_best_s,
          100.0 * sp.scatter_best_s / sp.gather_best_s, 100.0 * sp.gather_paired,
          sp.bytes / sp.axpy_best_s / 1e9, 100.0 * sp.read_best_s / sp.axpy_best_s,
          100.0 * sp.scatter_best_s / sp.axpy_best_s, 100.0 * sp.axpy_paired);
      sparse_lines.push_back(line);
      const double gb = w.bytes / 1e9;
      std::printf(
          "%-6s %6lld x %-5lld %4.0f %3d %8.3f %8.3f %7.1f %7.1f %6.0f%% %6.0f%% %6.0f%% %7.1f "
          "%6.0f%% %9.1f\n",
          name.c_str(), static_cast<long long>(w.view.rows),
          static_cast<long long>(w.view.cols), w.bytes / 1048576.0, o.threads[i],
          g.gemv_best_s * 1e3, g.gemv_median_s * 1e3, gb / g.gemv_best_s, gb / g.read_best_s,
          100.0 * g.read_best_s / g.gemv_best_s, 100.0 * g.read_median_s / g.gemv_median_s,
          100.0 * g.paired_ratio, in_cache, 100.0 * o.threads[i] * in_cache * g.read_best_s / gb,
          gemm);
      std::fflush(stdout);
      for (Pair& p : pairs) {
        if (p.type != type) continue;
        (bench_type.interleaved ? p.x8_gemv : p.row_gemv)[i] = gb / g.gemv_best_s;
        (bench_type.interleaved ? p.x8_gemm : p.row_gemm)[i] = gemm;
      }
    }
  }
  std::printf(
      "\nGEMV GB/s: weight bytes / best GEMV time. read GB/s: best plain read of the same copies, "
      "timed interleaved with the GEMVs. best ratio = best GEMV rate / best read rate; median "
      "ratio likewise with medians; paired ratio: median over (GEMV, next read) pairs of read "
      "time / GEMV time. in L2: best one-thread GEMV over ~256 KiB of rows that stay in L2 (the "
      "kernel's "
      "compute ceiling per thread); ceiling ratio = threads x in-L2 rate / best read rate, the "
      "most the best ratio can reach. GEMM: %lld tokens, best of 3, 2 flops per weight per "
      "token.\n",
      static_cast<long long>(o.gemm_tokens));
  std::printf(
      "\nSparse FFN kernels, %.0f%% of the rows (random, sorted ids), one token; GB/s of rows "
      "read, best of the rounds. read: best plain read of as many contiguous bytes, timed "
      "interleaved; scatter: best plain read of the same rows (same ids, the kernels' prefetch "
      "distance), the floor of the access pattern itself; best ratio = best read time / best "
      "kernel time; /scat: best scatter time / best kernel time; paired: median over (kernel, "
      "next read) pairs of contiguous read time / kernel time.\n",
      100.0 * o.sparse_fraction);
  std::printf("%-6s %3s %8s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s\n", "type", "thr", "rows",
              "read", "scatter", "gather", "best", "/scat", "paired", "axpy", "best", "/scat",
              "paired");
  for (const std::string& line : sparse_lines) std::printf("%s\n", line.c_str());
  std::printf("\n");
  for (const Pair& p : pairs) {
    const std::string row = BenchType{p.type}.name(), x8 = BenchType{p.type, true}.name();
    for (size_t i = 0; i < o.threads.size(); ++i) {
      if (p.row_gemv[i] > 0 && p.x8_gemv[i] > 0) {
        std::printf("%s / %s with %d thread(s): GEMV %.2fx, GEMM %.2fx\n", x8.c_str(),
                    row.c_str(), o.threads[i], p.x8_gemv[i] / p.row_gemv[i],
                    p.x8_gemm[i] / p.row_gemm[i]);
      }
    }
  }
  for (size_t i = 0; i < o.threads.size(); ++i) {
    ThreadPool pool(o.threads[i]);
    std::printf("hardware floor re-measured at the end: %.1f GB/s with %d thread(s)\n",
                MeasureReadBandwidthGBs(pool, static_cast<size_t>(o.working_set_mib) << 20),
                o.threads[i]);
  }
  return 0;
}

}  // namespace
}  // namespace thermocline

int main(int argc, char** argv) { return thermocline::Main(argc, argv); }
