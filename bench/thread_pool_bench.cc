// What a parallel region costs against what splitting saves: the measurement behind
// ThreadPool::kMinParallelBytes (docs/performance.md, "Threads on a busy machine").
//
//   thread_pool_bench [--threads=2] [--rounds=7] [--cols=256]
//
// 1. Overhead: a claimed region of `threads` empty pieces, back to back (workers spinning), and
//    after 2 ms idle (workers asleep), timed on the caller.
// 2. Crossover: a GEMV over a matrix of B bytes (f32 and q4_0 rows of `cols` values, in cache as
//    a small model's weights are), run on the caller alone and split into pieces over the pool
//    (forced, whatever the threshold), for B from 4 KiB to 1 MiB. The ratio alone/split > 1
//    is where splitting pays; the threshold is the smallest B from which it stays above 1.
// Medians of `rounds` alternating rounds; the load average is printed at start and end.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "shared/gguf/ggml_type.h"
#include "shared/gguf/matrix_view.h"
#include "shared/gguf/quant.h"
#include "shared/kernels/matmul.h"
#include "shared/util/cpu_features.h"
#include "shared/util/load_average.h"
#include "shared/util/thread_pool.h"

namespace thermocline {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void PrintLoad(const char* when) {
  absl::StatusOr<LoadAverage> l = ReadLoadAverage();
  if (!l.ok()) {
    std::printf("load %s: %s\n", when, std::string(l.status().message()).c_str());
    return;
  }
  std::printf("load %s: %.2f %.2f %.2f, runnable %d, cpus %d\n", when, l->one, l->five,
              l->fifteen, l->runnable, UsableCpus());
}

bool ParseInt(const std::string& a, const char* name, int64_t& out) {
  const std::string prefix = std::string("--") + name + "=";
  if (a.rfind(prefix, 0) != 0) return false;
  if (!absl::SimpleAtoi(a.substr(prefix.size()), &out) || out <= 0) {
    std::fprintf(stderr, "thread_pool_bench: bad %s\n", a.c_str());
    std::exit(2);
  }
  return true;
}

int Main(int argc, char** argv) {
  int64_t threads = 2, rounds = 7, cols = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (ParseInt(a, "threads", threads) || ParseInt(a, "rounds", rounds) ||
        ParseInt(a, "cols", cols)) {
      continue;
    }
    std::fprintf(stderr, "usage: thread_pool_bench [--threads=2] [--rounds=7] [--cols=256]\n");
    return a == "--help" ? 0 : 2;
  }
  if (threads < 2 || cols % 32 != 0) {
    std::fprintf(stderr, "thread_pool_bench: --threads >= 2 and --cols a multiple of 32\n");
    return 2;
  }
  std::printf("kernels: %s, threads %lld\n", SimdLevelName(DetectSimdLevel()),
              static_cast<long long>(threads));
  PrintLoad("at start");
  ThreadPool pool(static_cast<int>(threads));

  // 1. Overhead of one region.
  {
    auto empty = [](int, int64_t) {};
    std::vector<double> hot, cold;
    for (int64_t r = 0; r < rounds; ++r) {
      const int reps = 20000;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) pool.ForEachPiece(threads, empty);
      hot.push_back(Seconds(t0, std::chrono::steady_clock::now()) / reps * 1e9);
      std::vector<double> c;
      for (int i = 0; i < 20; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const auto t1 = std::chrono::steady_clock::now();
        pool.ForEachPiece(threads, empty);
        c.push_back(Seconds(t1, std::chrono::steady_clock::now()) * 1e9);
      }
      cold.push_back(Median(c));
    }
    std::printf("region of %lld empty pieces: %.0f ns back to back, %.0f ns after 2 ms idle\n",
                static_cast<long long>(threads), Median(hot), Median(cold));
  }

  // 2. Crossover.
  std::printf("%-6s %10s %8s %12s %12s %8s\n", "type", "bytes", "rows", "alone us", "split us",
              "ratio");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(cols), row(cols);
  for (float& v : x) v = u(rng);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ4_0}) {
    const int64_t row_bytes = RowBytes(type, cols);
    for (int64_t bytes = 4 << 10; bytes <= (1 << 20); bytes *= 2) {
      const int64_t rows = std::max<int64_t>(1, bytes / row_bytes);
      std::vector<uint8_t> data(rows * row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = u(rng);
        QuantizeRow(type, row.data(), data.data() + r * row_bytes, cols);
      }
      const MatrixView w{type, rows, cols, data.data(), row_bytes};
      std::vector<float> y(rows);
      // About 2 ms of work per timing, whatever the size.
      const int reps = static_cast<int>(std::max<int64_t>(20, (64 << 20) / (rows * row_bytes)));
      const int64_t grain = std::max<int64_t>(1, rows / (4 * threads));
      auto alone = [&] { MatMulRows(w, x.data(), 1, cols, y.data(), rows, 0, rows); };
      auto split = [&] {
        pool.ParallelFor(
            rows,
            [&](int64_t r0, int64_t r1) {
              MatMulRows(w, x.data(), 1, cols, y.data(), rows, r0, r1);
            },
            grain);
      };
      std::vector<double> ta, ts;
      for (int64_t r = 0; r < rounds; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) alone();
        ta.push_back(Seconds(t0, std::chrono::steady_clock::now()) / reps * 1e6);
        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) split();
        ts.push_back(Seconds(t0, std::chrono::steady_clock::now()) / reps * 1e6);
      }
      const double a = Median(ta), s = Median(ts);
      std::printf("%-6s %10lld %8lld %12.2f %12.2f %8.2f\n",
                  std::string(TypeTraits(type).name).c_str(),
                  static_cast<long long>(rows * row_bytes), static_cast<long long>(rows), a, s,
                  a / s);
      std::fflush(stdout);
    }
  }
  std::printf("threshold in use: kMinParallelBytes = %lld, kMinPieceBytes = %lld\n",
              static_cast<long long>(ThreadPool::kMinParallelBytes),
              static_cast<long long>(ThreadPool::kMinPieceBytes));
  PrintLoad("at end");
  return 0;
}

}  // namespace
}  // namespace thermocline

int main(int argc, char** argv) { return thermocline::Main(argc, argv); }
