// Decode throughput against the memory-bandwidth floor, measured in the same run.
//
// A decode step must read every weight once, so tokens/s can be at most
//   read bandwidth / bytes read per token.
// For each model and thread count this prints the measured read bandwidth, the floor it implies,
// the measured decode tokens/s, and their ratio (the figure of merit; raw tokens/s are noisy here).
// The load average (/proc/loadavg: 1-minute average and threads runnable at that moment) is
// printed at the start and end of every measurement: on a busy machine the 1- vs 2-thread
// figures mean little without it.
//
// It also times the prompt that precedes the decode loop (`--prompt` tokens of fixed ids 3, 4,
// ..., one batch; the second of two runs, so that page faults are not counted): prompt tokens/s,
// the figure bench/llama_cpp/decode.mjs measures for llama.cpp on the same file.
//
// Usage: decode_bench --model M.gguf [--model M2.gguf ...] [--threads 1,2] [--tokens 32]
//                     [--prompt 8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "bench/bench_util.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/util/cpu_features.h"
#include "shared/util/load_average.h"
#include "shared/util/membw.h"

using namespace thermocline;

namespace {

using bench::LoadNow;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "decode_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<int> threads = {1, 2};
  int tokens = 32;
  int prompt = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--model" && has_value) {
      models.push_back(argv[++i]);
    } else if (a == "--threads" && has_value) {
      if (!bench::ParseThreadList(argv[++i], threads)) {
        std::fprintf(stderr, "decode_bench: bad --threads\n");
        return 2;
      }
    } else if (a == "--tokens" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &tokens) || tokens <= 0) {
        std::fprintf(stderr, "decode_bench: bad --tokens\n");
        return 2;
      }
    } else if (a == "--prompt" && has_value) {
      if (!absl::SimpleAtoi(argv[++i], &prompt) || prompt <= 0) {
        std::fprintf(stderr, "decode_bench: bad --prompt\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: decode_bench --model M.gguf [--model ...] [--threads 1,2] [--tokens N] "
                   "[--prompt N]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "decode_bench: give at least one --model\n");
    return 2;
  }
  std::printf("kernels: %s, cpus %d; load = 1-minute average/threads runnable\n",
              bench::KernelFamily(), UsableCpus());
  std::printf("%-28s %7s %8s %12s %10s %10s %10s %7s %11s %11s %12s\n", "model", "type", "threads",
              "MB/token", "read GB/s", "floor t/s", "tok/s", "ratio", "load start", "load end",
              "prompt t/s");
  for (const std::string& path : models) {
    auto model = bench::LoadForDenseDecode(path);
    if (!model.ok()) return Fail(model.status());
    const ModelConfig& c = (*model)->config();
    if (prompt + tokens > c.context_length) {
      std::fprintf(stderr,
                   "decode_bench: %s: --prompt %d + --tokens %d is more than the model's context "
                   "of %lld positions\n",
                   path.c_str(), prompt, tokens, static_cast<long long>(c.context_length));
      return 2;
    }
    auto kv = KvCache::Create(c, 1, std::min<int64_t>(c.context_length, prompt + tokens + 1),
                              GgmlType::kF32);
    if (!kv.ok()) return Fail(kv.status());
    for (int nt : threads) {
      ThreadPool pool(nt);
      ForwardPass pass(**model, *kv, pool);
      std::vector<float> logits;
      std::vector<BatchEntry> batch;
      for (int p = 0; p < prompt; ++p) batch.push_back({0, p, 3 + p, p == prompt - 1});
      double prompt_s = 0;
      for (int warm = 0; warm < 2; ++warm) {
        kv->Reset(0);
        const auto p0 = std::chrono::steady_clock::now();
        if (absl::Status st = pass.Run(batch, logits); !st.ok()) return Fail(st);
        prompt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
      }
      // Bandwidth right before the decode loop, with the same threads, so both see the same
      // machine state.
      const double bw = MeasureReadBandwidthGBs(pool);
      // Attention also reads the KV cache: on average half the positions of the run.
      const double kv_bytes = 2.0 * c.n_layers * c.kv_dim * 4 * (prompt + tokens / 2.0);
      const double bytes = static_cast<double>((*model)->decode_bytes_per_token()) + kv_bytes;
      const std::string load_start = LoadNow();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < tokens; ++i) {
        BatchEntry e{0, prompt + i, 3 + (i % 200), true};
        if (absl::Status st = pass.Run(std::span<const BatchEntry>(&e, 1), logits); !st.ok()) {
          return Fail(st);
        }
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string load_end = LoadNow();
      const double tps = tokens / s, floor = bw * 1e9 / bytes;
      std::string name = path.substr(path.find_last_of('/') + 1);
      std::printf("%-28s %7s %8d %12.1f %10.2f %10.2f %10.2f %7.3f %11s %11s %12.2f\n",
                  name.c_str(), (*model)->weight_type_name().c_str(), nt, bytes / 1e6, bw, floor,
                  tps, tps / floor, load_start.c_str(), load_end.c_str(), prompt / prompt_s);
      std::fflush(stdout);
    }
  }
  return 0;
}
