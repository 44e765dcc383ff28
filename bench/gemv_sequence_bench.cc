// The dense matrices of a decode step multiplied one after another, as a decode runs them,
// against the read floor measured in the same rounds; and the same sequence with a plain read
// of other memory before every product, which is what gemv_bench does between its GEMVs.
//
// Why it exists: on Intel Emerald Rapids a GEMV that followed another GEMV read 6-9% slower
// than the same GEMV after a plain read, while the weights were prefetched to L2 (T1). A decode
// is nothing but GEMVs one after another, so gemv_bench's ratios (90-93%) overstated what the
// decode got (0.81-0.85 of its floor); docs/performance.md, "GEMVs one after another". The
// "read first / back to back" column shows whether the kernels depend on what ran before them.
//
// Each round times: the sequence back to back; a plain read of as many bytes (the floor, same
// threads); a plain read of the very bytes the sequence multiplies, matrix by matrix with the
// pool split and joined for each as MatMul does ("seq read": the floor of the decode's access
// pattern, every matrix's shares starting cold); the sequence with an --gap_mib read of fresh
// memory before each product (the reads' time left out). Medians over the rounds after the first. One token, the product's layouts
// (the interleaved dense FFN copies of InterleaveDenseFfn); each matrix is its own MatMul, where
// the decode joins q, k, v and gate, up into one region each (MatMulMany): the same bytes.
// MoE experts and PowerInfer's ffn_down_t are left out (not dense products).
//
// Usage: gemv_sequence_bench --model M.gguf [--model ...] [--threads 1,2] [--rounds 7]
//                            [--gap_mib 8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "bench/bench_util.h"
#include "shared/kernels/matmul.h"
#include "shared/model/model.h"
#include "shared/util/membw.h"
#include "shared/util/thread_pool.h"

using namespace thermocline;

namespace {

constexpr size_t kRegion = size_t{1} << 30;  // the floor's bytes, then the gaps' bytes

int Usage(int code) {
  std::fprintf(stderr,
               "usage: gemv_sequence_bench --model M.gguf [--model ...] [--threads 1,2] "
               "[--rounds 7] [--gap_mib 8]\n");
  return code;
}

std::vector<const MatrixView*> DecodeOrder(const Model& m) {
  std::vector<const MatrixView*> seq;
  for (int64_t l = 0; l < m.config().n_layers; ++l) {
    const LayerWeights& w = m.layer(l);
    for (const MatrixView* v : {&w.wq, &w.wk, &w.wv, &w.wo, &w.gate, &w.up, &w.down}) {
      if (!v->empty()) seq.push_back(v);
    }
  }
  seq.push_back(&m.output());
  return seq;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<int> threads = {1, 2};
  int rounds = 7, gap_mib = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--model" && has_value) {
      models.push_back(argv[++i]);
    } else if (a == "--threads" && has_value) {
      if (!bench::ParseThreadList(argv[++i], threads)) return Usage(2);
    } else if (a == "--rounds" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &rounds) || rounds < 2) return Usage(2);
    } else if (a == "--gap_mib" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &gap_mib) || gap_mib <= 0 || gap_mib > 512) {
        return Usage(2);
      }
    } else {
      return Usage(a == "--help" ? 0 : 2);
    }
  }
  if (models.empty()) return Usage(2);
  bench::Buffer mem = bench::Allocate(2 * kRegion);
  if (mem.data() == nullptr) {
    std::fprintf(stderr, "gemv_sequence_bench: cannot allocate 2 GiB\n");
    return 1;
  }
  std::fill(mem.data(), mem.data() + 2 * kRegion, uint8_t{1});  // touched: no faults in timings
  const uint8_t* floor_buf = mem.data();
  const uint8_t* gap_buf = mem.data() + kRegion;
  const size_t gap = static_cast<size_t>(gap_mib) << 20;

  std::printf("kernels: %s, cpus %d; medians of %d rounds; gaps of %d MiB\n", bench::KernelFamily(),
              UsableCpus(), rounds - 1, gap_mib);
  std::printf("%-26s %6s %3s %9s %9s %13s %7s %9s %7s %9s %12s %7s %11s %9s\n", "model", "type",
              "thr", "MB/seq", "read GB/s", "back to back", "ratio", "seq read", "ratio",
              "b2b/seq", "read first", "ratio", "first/b2b", "load");
  for (const std::string& path : models) {
    auto model = bench::LoadForDenseDecode(path);
    if (!model.ok()) {
      std::fprintf(stderr, "gemv_sequence_bench: %s\n",
                   std::string(model.status().message()).c_str());
      return 1;
    }
    const std::vector<const MatrixView*> seq = DecodeOrder(**model);
    double bytes = 0;
    int64_t max_rows = 0, max_cols = 0;
    for (const MatrixView* w : seq) {
      bytes += static_cast<double>(w->rows) * w->row_data_bytes();
      max_rows = std::max(max_rows, w->rows);
      max_cols = std::max(max_cols, w->cols);
    }
    std::vector<float> x(max_cols), y(max_rows);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.001f * static_cast<float>(i % 97) - 0.05f;
    const size_t floor_bytes = std::min(kRegion, static_cast<size_t>(bytes)) / 64 * 64;
    for (int nt : threads) {
      ThreadPool pool(nt);
      std::vector<double> b2b, first, read, seq_read;
      size_t gap_at = 0;
      for (int r = 0; r < rounds; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (const MatrixView* w : seq) MatMul(*w, x.data(), 1, w->cols, y.data(), w->rows, pool);
        const double b2b_s = bench::Seconds(t0, std::chrono::steady_clock::now());
        const double read_s = TimeParallelRead(pool, floor_buf, floor_bytes);
        t0 = std::chrono::steady_clock::now();
        for (const MatrixView* w : seq) {
          // What MatMul reads: the interleaved copy where there is one (as many bytes).
          TimeParallelRead(pool, w->interleaved != nullptr ? w->interleaved : w->data,
                           static_cast<size_t>(w->rows * w->row_data_bytes()) / 32 * 32);
        }
        const double seq_read_s = bench::Seconds(t0, std::chrono::steady_clock::now());
        double first_s = 0;
        for (const MatrixView* w : seq) {
          if (gap_at + gap > kRegion) gap_at = 0;
          TimeParallelRead(pool, gap_buf + gap_at, gap);
          gap_at += gap;
          t0 = std::chrono::steady_clock::now();
          MatMul(*w, x.data(), 1, w->cols, y.data(), w->rows, pool);
          first_s += bench::Seconds(t0, std::chrono::steady_clock::now());
        }
        if (r == 0) continue;  // page faults and first touches
        b2b.push_back(bytes / b2b_s / 1e9);
        first.push_back(bytes / first_s / 1e9);
        read.push_back(static_cast<double>(floor_bytes) / read_s / 1e9);
        seq_read.push_back(bytes / seq_read_s / 1e9);
      }
      const double rd = bench::Median(read), bb = bench::Median(b2b), fi = bench::Median(first),
                   sr = bench::Median(seq_read);
      const std::string name = path.substr(path.find_last_of('/') + 1);
      std::printf("%-26s %6s %3d %9.1f %9.2f %13.2f %7.3f %9.2f %7.3f %9.3f %12.2f %7.3f %11.3f %9s\n",
                  name.c_str(), (*model)->weight_type_name().c_str(), nt, bytes / 1e6, rd, bb,
                  bb / rd, sr, sr / rd, bb / sr, fi, fi / rd, fi / bb, bench::LoadNow().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
