// The hardware floor of the sparse kernels: how fast plain reads of scattered rows go, against a
// contiguous read of as many bytes timed right after, in the same run.
//
// A sparse FFN (exact, predicted) and TEAL read a subset of a matrix's rows, sorted, one run of
// row_bytes at each chosen row. The contiguous read floor the decode benchmarks report is the
// rate of long sequential streams; scattered runs can read far slower (each starts with a
// memory latency the hardware prefetcher does not hide, and only as many lines are in flight as
// the core has miss buffers), so a kernel can sit well below the contiguous floor while reading
// as fast as this machine reads that pattern at all. This separates the two.
//
// For each thread count, row size and density: matrices of --rows rows fill the working set; in
// each, every row is chosen with probability `density` (sorted ids, a new draw per matrix, like
// the active neurons of successive layers). The rows of one matrix after another are read with
// TimeScatteredRead, with the kernels' prefetch (rows at least 32 KiB on, as kPrefetchAheadBytes)
// and without, each followed by a contiguous read of as many bytes of a far part of the buffer.
// GB/s count the bytes of the chosen rows; "ratio" is contiguous time / scattered time; all
// figures are medians over the matrices of all rounds.
//
//   scatter_read_bench [--threads=1,2] [--row_bytes=1152,3456,6208,11008]
//                      [--density=0.05,0.13,0.5,1] [--rows=5504] [--working_set_mib=1024]
//                      [--rounds=2]
//
// 1152 bytes: a Q4_0 row of 2048 columns (q, k, v, o, gate and up of a 2048-wide model, and
// TEAL's transposed rows of down); 3456 and 6208: a q4_0 neuron's [gate | up | down] bundle and
// TEAL's transposed gate or up row of 5504 columns; 11008: an f16 row of 5504 (the predictor's
// fc2_t rows).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "bench/bench_util.h"
#include "shared/kernels/matmul.h"
#include "shared/util/membw.h"
#include "shared/util/thread_pool.h"

namespace thermocline {
namespace {

struct Options {
  std::vector<int> threads = {1, 2};
  std::vector<int64_t> row_bytes = {1152, 3456, 6208, 11008};
  std::vector<double> densities = {0.05, 0.13, 0.5, 1.0};
  int64_t rows = 5504;
  int64_t working_set_mib = 1024;
  int rounds = 2;
};

bool Parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* eq = std::strchr(a, '=');
    if (eq == nullptr) return false;
    const std::string key(a, eq);
    const char* v = eq + 1;
    int64_t n = 0;
    if (key == "--threads") {
      if (!bench::ParseThreadList(v, o.threads)) return false;
    } else if (key == "--row_bytes") {
      if (!bench::ParseList(v, o.row_bytes, [](int64_t b) { return b > 0; })) return false;
    } else if (key == "--density") {
      if (!bench::ParseList(v, o.densities, [](double d) { return d > 0 && d <= 1; })) {
        return false;
      }
    } else if (key == "--rows" && absl::SimpleAtoi(v, &n) && n > 0) {
      o.rows = n;
    } else if (key == "--working_set_mib" && absl::SimpleAtoi(v, &n) && n >= 64) {
      o.working_set_mib = n;
    } else if (key == "--rounds" && absl::SimpleAtoi(v, &n) && n > 0 && n <= 100) {
      o.rounds = static_cast<int>(n);
    } else {
      return false;
    }
  }
  return true;
}

// Medians over the matrices of all rounds: a time slice lost to another process hits one
// matrix, not the figure.
struct Result {
  double prefetched = 0, plain = 0;              // GB/s of the chosen rows
  double prefetched_ratio = 0, plain_ratio = 0;  // contiguous time / scattered time
  double contiguous = 0;                         // GB/s
};

Result Measure(const bench::Buffer& buf, int64_t row_bytes, double density, int64_t rows,
               int rounds, ThreadPool& pool) {
  const int64_t matrix = rows * row_bytes;
  const int64_t n_matrices = static_cast<int64_t>(buf.size()) / matrix;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> ratio[2], rate[2], contiguous_rate;
  for (int round = 0; round < rounds; ++round) {
    for (int64_t m = 0; m < n_matrices; ++m) {
      std::vector<int32_t> ids;
      for (int64_t r = 0; r < rows; ++r) {
        if (u(rng) < density) ids.push_back(static_cast<int32_t>(r));
      }
      if (ids.empty()) continue;
      const int64_t n = static_cast<int64_t>(ids.size());
      const double b = static_cast<double>(n * row_bytes);
      const int prefetch = static_cast<int>(m % 2);  // alternate, so both see the same phases
      const double t = TimeScatteredRead(pool, buf.data() + m * matrix, row_bytes, ids.data(), n,
                                         prefetch ? kGatherPrefetchAheadBytes : 0);
      // Half the buffer away: not what was just read, and (working set >> LLC) not in cache.
      const int64_t far = (m + n_matrices / 2) % n_matrices;
      const double c =
          TimeParallelRead(pool, buf.data() + far * matrix, static_cast<size_t>(b) / 32 * 32);
      rate[prefetch].push_back(b / t / 1e9);
      ratio[prefetch].push_back(c / t);
      contiguous_rate.push_back(b / c / 1e9);
    }
  }
  Result r;
  r.plain = bench::Median(rate[0]);
  r.prefetched = bench::Median(rate[1]);
  r.plain_ratio = bench::Median(ratio[0]);
  r.prefetched_ratio = bench::Median(ratio[1]);
  r.contiguous = bench::Median(contiguous_rate);
  return r;
}

}  // namespace
}  // namespace thermocline

int main(int argc, char** argv) {
  using namespace thermocline;
  Options o;
  if (!Parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: scatter_read_bench [--threads=1,2] [--row_bytes=1152,3456,6208,11008] "
                 "[--density=0.05,0.13,0.5,1] [--rows=5504] [--working_set_mib=1024] "
                 "[--rounds=2]\n");
    return 2;
  }
  const size_t total = static_cast<size_t>(o.working_set_mib) << 20;
  bench::Buffer buf = bench::Allocate(total);
  if (buf.data() == nullptr) {
    std::fprintf(stderr, "scatter_read_bench: cannot allocate %lld MiB\n",
                 static_cast<long long>(o.working_set_mib));
    return 1;
  }
  for (size_t i = 0; i < total; i += 8) {
    const uint64_t v = i * 0x9E3779B97F4A7C15ull;
    std::memcpy(buf.data() + i, &v, sizeof v);
  }
  for (int64_t rb : o.row_bytes) {
    if (o.rows * rb * 2 > static_cast<int64_t>(total)) {
      std::fprintf(stderr, "scatter_read_bench: --working_set_mib too small for %lld x %lld\n",
                   static_cast<long long>(o.rows), static_cast<long long>(rb));
      return 2;
    }
  }
  std::printf("load: %s\n", bench::LoadNow().c_str());
  std::printf("%3s %9s %7s %10s %10s %7s %10s %7s\n", "thr", "row bytes", "density", "contig",
              "prefetched", "ratio", "no pf", "ratio");
  for (int nt : o.threads) {
    ThreadPool pool(nt);
    const double floor = MeasureReadBandwidthGBs(pool);
    for (int64_t rb : o.row_bytes) {
      for (double d : o.densities) {
        const Result r = Measure(buf, rb, d, o.rows, o.rounds, pool);
        std::printf("%3d %9lld %7.2f %10.1f %10.1f %7.2f %10.1f %7.2f\n", nt,
                    static_cast<long long>(rb), d, r.contiguous, r.prefetched, r.prefetched_ratio,
                    r.plain, r.plain_ratio);
        std::fflush(stdout);
      }
    }
    std::printf("hardware floor (MeasureReadBandwidthGBs, %d thread(s)): %.1f GB/s\n", nt, floor);
  }
  std::printf(
      "\nGB/s: bytes of the chosen rows per second; every figure a median over the matrices. "
      "contig: a contiguous read of as many bytes, timed right after each scattered read. "
      "ratio: contiguous time / scattered time. prefetched: every line of the row 32 KiB of rows "
      "on "
      "(the sparse kernels' distance); no pf: the hardware prefetcher alone.\n");
  return 0;
}
