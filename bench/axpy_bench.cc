// AxpyRows throughput on the two shapes that limit the sparse decode modes, against the memory
// read floor measured in the same run, for f16, q8_0 and q4_0 rows:
//
//   ffn:  550 of 5504 rows of 2048 (a 1.3B layer's down_t at 10% activity, `predicted`), one
//         AxpyRows call with the pool: threads split the ids and add partial sums at the end,
//         as NeuronFfn's shares do.
//   teal: 1024 of 2048 rows of 5504 (the transposed gate/up at TEAL 50%), one
//         InputSparseMatVec: threads split the kept inputs into shares, each summed by AxpyRows
//         (IntAxpyRows for q4_0) into its own partial.
//   teal2k: the same over 2048 rows of 2048 (the transposed q, k, v, o at TEAL 50%).
//
//   axpy_bench [--threads=1,2] [--rounds=5] [--types=f16,q8_0,q4_0] [--working_set_mib=256]
//
// Each type's matrix is copied to fill the working set and successive calls walk through the
// copies, so the rows come from DRAM as in a model's layers. Right after each call the pool reads
// as many contiguous bytes of a far copy (the floor for a call of that size, under the same
// load), then a whole other copy, so no call finds its rows still cached. "in L2" is the same
// call on one thread over the first ~256 KiB of its rows, repeated while they stay in L2: the
// kernel's compute rate per thread. Where threads x that is below the read floor the call is
// compute-bound.
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
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/matrix_view.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul.h"
#include "shared/sparsity/teal.h"
#include "shared/util/cpu_features.h"
#include "shared/util/membw.h"
#include "shared/util/thread_pool.h"

namespace thermocline {
namespace {

struct Options {
  std::vector<int> threads = {1, 2};
  int rounds = 5;
  std::vector<GgmlType> types = {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0};
  int64_t working_set_mib = 256;
};

// How a caller runs AxpyRows over a shape.
enum class Caller { kFfn, kTeal };
struct Shape {
  const char* name;
  Caller caller;
  int64_t rows, cols, n_ids;
};
constexpr Shape kShapes[] = {{"ffn", Caller::kFfn, 5504, 2048, 550},
                             {"teal", Caller::kTeal, 2048, 5504, 1024},
                             {"teal2k", Caller::kTeal, 2048, 2048, 1024}};

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
    const std::string_view a = argv[i];
    const size_t eq = a.find('=');
    if (a.substr(0, 2) != "--" || eq == std::string_view::npos) return false;
    const std::string_view key = a.substr(2, eq - 2);
    const std::string value(a.substr(eq + 1));
    if (key == "threads") {
      o.threads.clear();
      for (std::string_view t : Split(value)) {
        o.threads.push_back(std::atoi(std::string(t).c_str()));
      }
    } else if (key == "types") {
      o.types.clear();
      for (std::string_view t : Split(value)) {
        const auto type = TypeFromName(t);
        if (!type || !IsWeightType(*type) || !HasQuantizer(*type)) return false;
        o.types.push_back(*type);
      }
    } else if (key == "rounds") {
      o.rounds = std::atoi(value.c_str());
    } else if (key == "working_set_mib") {
      o.working_set_mib = std::atoll(value.c_str());
    } else {
      return false;
    }
  }
  for (int t : o.threads) {
    if (t < 1) return false;
  }
  for (GgmlType t : o.types) {
    for (const Shape& s : kShapes) {
      if (s.cols % TypeTraits(t).block_size != 0) return false;
    }
  }
  return o.rounds >= 1 && o.working_set_mib >= 1 && !o.types.empty() && !o.threads.empty();
}

using bench::Allocate;
using bench::Buffer;
using bench::Median;
using bench::Seconds;

// One quantized matrix copied to fill the working set (a few hundred distinct random rows tiled
// over the rows: content does not change the speed).
struct Weights {
  std::vector<Buffer> copies;
  MatrixView view;  // of copies[0]
  int64_t bytes = 0;
  MatrixView Copy(size_t k) const {
    MatrixView v = view;
    v.data = copies[k].data();
    return v;
  }
};

Weights MakeWeights(GgmlType type, const Shape& s, int64_t working_set_mib) {
  Weights w;
  const int64_t row_bytes = RowBytes(type, s.cols);
  w.bytes = s.rows * row_bytes;
  constexpr int64_t kDistinctRows = 256;
  std::vector<uint8_t> distinct(kDistinctRows * row_bytes);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> src(s.cols);
  for (int64_t r = 0; r < kDistinctRows; ++r) {
    for (float& f : src) f = normal(rng);
    QuantizeRow(type, src.data(), distinct.data() + r * row_bytes, s.cols);
  }
  // At least three copies: the call's, the far one its floor reads, and the one that evicts.
  const int64_t n_copies =
      std::max<int64_t>(3, ((working_set_mib << 20) + w.bytes - 1) / w.bytes);
  for (int64_t k = 0; k < n_copies; ++k) {
    Buffer b = Allocate(w.bytes);
    for (int64_t r = 0; r < s.rows; ++r) {
      std::memcpy(b.data() + r * row_bytes, distinct.data() + (r % kDistinctRows) * row_bytes,
                  row_bytes);
    }
    w.copies.push_back(std::move(b));
  }
  w.view = MatrixView{type, s.rows, s.cols, w.copies[0].data(), row_bytes};
  return w;
}

// The call under test: AxpyRows over ids (ffn) or InputSparseMatVec with x zero off the ids
// (teal; the cut 0 keeps exactly the non-zero inputs, so both read the same rows).
struct Call {
  const Shape& shape;
  std::vector<int32_t> ids;
  std::vector<float> coeffs;     // ffn: per id; teal: x, one per row
  std::vector<float> id_coeffs;  // per id (teal: x at the ids)
  std::vector<float> y;
  std::vector<int32_t> teal_ids;  // InputSparseMatVec's scratch
  std::vector<float> teal_coeffs;

  Call(const Shape& s, std::mt19937& rng)
      : shape(s), coeffs(s.caller == Caller::kTeal ? s.rows : s.n_ids) {
    std::vector<int32_t> all(s.rows);
    for (int64_t r = 0; r < s.rows; ++r) all[r] = static_cast<int32_t>(r);
    std::shuffle(all.begin(), all.end(), rng);
    ids.assign(all.begin(), all.begin() + s.n_ids);
    std::sort(ids.begin(), ids.end());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    if (s.caller == Caller::kTeal) {
      for (int32_t id : ids) coeffs[id] = normal(rng);
    } else {
      for (float& c : coeffs) c = normal(rng);
    }
    for (int32_t i = 0; i < s.n_ids; ++i) {
      id_coeffs.push_back(coeffs[s.caller == Caller::kTeal ? ids[i] : i]);
    }
    y.assign(s.cols, 0.0f);
  }

  // Runs over the first n of the ids (all of them for n < 0).
  void Run(const MatrixView& w, ThreadPool& pool, int64_t n = -1) {
    if (n < 0) n = shape.n_ids;
    if (shape.caller == Caller::kFfn) {
      AxpyRows(w, ids.data(), coeffs.data(), n, y.data(), pool);
      return;
    }
    if (n == shape.n_ids) {
      InputSparseMatVec(w, coeffs.data(), 0.0f, teal_ids, teal_coeffs, y.data(), pool);
      return;
    }
    // The in-L2 form: the first n kept rows, into InputSparseMatVec's zeroed output, by the
    // kernel it uses.
    std::fill(y.begin(), y.end(), 0.0f);
    if (HasIntAxpy(w.type)) {
      IntAxpyRows(w, ids.data(), id_coeffs.data(), n, y.data());
    } else {
      AxpyRows(w, ids.data(), id_coeffs.data(), n, y.data(), pool);
    }
  }
};

struct Result {
  double call_best_s = 1e30, read_best_s = 1e30;
  double paired = 0;  // median over (call, next read) pairs of read time / call time
  double in_l2_gbs = 0;
  int64_t bytes = 0;  // row bytes one call reads
};

Result Time(const Weights& w, Call& call, int rounds, ThreadPool& pool) {
  Result res;
  res.bytes = call.shape.n_ids * w.view.row_bytes;
  const size_t n = w.copies.size();
  for (size_t k = 0; k < n; ++k) call.Run(w.Copy(k), pool);  // warm up: pages, thread wake-up
  std::vector<double> pairs;
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < n; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      call.Run(w.Copy(k), pool);
      const double t = Seconds(t0, std::chrono::steady_clock::now());
      const double r = TimeParallelRead(pool, w.copies[(k + n / 2) % n].data(), res.bytes);
      res.call_best_s = std::min(res.call_best_s, t);
      res.read_best_s = std::min(res.read_best_s, r);
      pairs.push_back(r / t);
      TimeParallelRead(pool, w.copies[(k + n / 4 + 1) % n].data(), w.bytes);
    }
  }
  res.paired = Median(pairs);
  ThreadPool solo(1);
  const int64_t n_l2 =
      std::clamp<int64_t>((int64_t{256} << 10) / w.view.row_bytes, 16, call.shape.n_ids);
  double best = 1e30;
  for (int rep = 0; rep < 200; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    call.Run(w.view, solo, n_l2);
    best = std::min(best, Seconds(t0, std::chrono::steady_clock::now()));
  }
  res.in_l2_gbs = static_cast<double>(n_l2 * w.view.row_bytes) / best / 1e9;
  return res;
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseFlags(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: axpy_bench [--threads=1,2] [--rounds=5] [--types=f16,q8_0,q4_0]\n"
                 "                  [--working_set_mib=256]\n");
    return 2;
  }
  std::printf("axpy_bench: kernels=%s, working set %lld MiB per type and shape, %d rounds\n",
              bench::KernelFamily(), static_cast<long long>(o.working_set_mib),
              o.rounds);
  for (int t : o.threads) {
    ThreadPool pool(t);
    std::printf("hardware floor: read bandwidth %.1f GB/s with %d thread(s)\n",
                MeasureReadBandwidthGBs(pool, static_cast<size_t>(o.working_set_mib) << 20), t);
  }
  std::printf("\n%-6s %-5s %3s %11s %6s %7s %7s %6s %7s %7s %7s\n", "shape", "type", "thr",
              "rows", "MB", "axpy", "read", "best", "paired", "in L2", "ceiling");
  std::printf("%-6s %-5s %3s %11s %6s %7s %7s %6s %7s %7s %7s\n", "", "", "", "", "/call", "GB/s",
              "GB/s", "ratio", "ratio", "GB/s", "ratio");
  for (const Shape& s : kShapes) {
    for (GgmlType type : o.types) {
      const Weights w = MakeWeights(type, s, o.working_set_mib);
      std::mt19937 rng(7);
      Call call(s, rng);
      for (int t : o.threads) {
        ThreadPool pool(t);
        const Result r = Time(w, call, o.rounds, pool);
        char rows[32];
        std::snprintf(rows, sizeof rows, "%lld/%lld", static_cast<long long>(s.n_ids),
                      static_cast<long long>(s.rows));
        std::printf("%-6s %-5s %3d %11s %6.2f %7.1f %7.1f %5.0f%% %6.0f%% %7.1f %6.0f%%\n", s.name,
                    std::string(TypeTraits(type).name).c_str(), t, rows, r.bytes / 1e6, r.bytes / r.call_best_s / 1e9,
                    r.bytes / r.read_best_s / 1e9, 100.0 * r.read_best_s / r.call_best_s,
                    100.0 * r.paired, r.in_l2_gbs,
                    100.0 * t * r.in_l2_gbs * r.read_best_s / r.bytes * 1e9);
        std::fflush(stdout);
      }
    }
  }
  std::printf(
      "\naxpy GB/s: row bytes one call reads / best call time. read GB/s: best plain read of as "
      "many contiguous bytes, timed right after each call. best ratio = best read time / best "
      "call time; paired: median over (call, next read) pairs of read time / call time. in L2: "
      "one thread over the first ~256 KiB of the call's rows, repeated (the kernel's compute "
      "rate); ceiling = threads x in-L2 rate / read rate.\n");
  return 0;
}

}  // namespace
}  // namespace thermocline

int main(int argc, char** argv) { return thermocline::Main(argc, argv); }
