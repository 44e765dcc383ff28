// TEAL decode throughput against dense, measured in the same run: for each model and thread
// count, rounds that alternate a dense decode and a TEAL decode of the same greedy loop
// (decode_loop.h), so both see the same machine state; medians of the per-step times.
//
// TEAL here is per-token top-k at --sparsity S on every projection (TealPlan::TopShare: no
// calibration needed, exactly S of each input dropped per token; a calibrated profile reads
// the same bytes at the same model-level sparsity). The bytes TEAL skips are S of the
// projection weights; attention over the KV cache, the norms and the output head are not
// sparsified, so the ideal ratio is below 1 / (1 - S).
//
// With --teal-profile P.gguf (from thermocline teal-calibrate) TEAL runs the profile's
// calibrated cuts for target --sparsity instead, as `generate --teal-profile` does: fixed cuts,
// no per-token selection, and per-projection sparsities from the greedy allocation.
//
// Usage: teal_decode_bench --model M.gguf [--model ...] [--threads 1,2] [--tokens 16]
//        [--rounds 3] [--sparsity 0.5] [--copy-type f16|q8_0] [--teal-profile P.gguf]
// --copy-type: the element type of a quantized model's transposed copies (TealOptions; default
// the model's own, requantized).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "bench/bench_util.h"
#include "bench/decode_loop.h"
#include "shared/model/model.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_profile.h"
#include "shared/util/cpu_features.h"

using namespace thermocline;

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<int> threads = {1, 2};
  int tokens = 16, rounds = 3;
  float sparsity = 0.5f;
  TealOptions teal_options;
  std::string profile_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    bool ok = true;
    if (a == "--model" && has_value) {
      models.push_back(argv[++i]);
    } else if (a == "--threads" && has_value) {
      ok = bench::ParseThreadList(argv[++i], threads);
    } else if (a == "--tokens" && has_value) {
      ok = absl::SimpleAtoi(argv[++i], &tokens) && tokens > 0;
    } else if (a == "--rounds" && has_value) {
      ok = absl::SimpleAtoi(argv[++i], &rounds) && rounds > 0;
    } else if (a == "--copy-type" && has_value) {
      const std::string t = argv[++i];
      ok = t == "f16" || t == "q8_0";
      teal_options.quantized_type = t == "f16" ? GgmlType::kF16 : GgmlType::kQ8_0;
    } else if (a == "--teal-profile" && has_value) {
      profile_path = argv[++i];
    } else if (a == "--sparsity" && has_value) {
      ok = absl::SimpleAtof(argv[++i], &sparsity) && sparsity > 0 && sparsity < 1;
    } else {
      std::fprintf(stderr,
                   "usage: teal_decode_bench --model M.gguf [--model ...] [--threads 1,2] "
                   "[--tokens N] [--rounds R] [--sparsity S] [--copy-type f16|q8_0] "
                   "[--teal-profile P.gguf]\n");
      return a == "--help" ? 0 : 2;
    }
    if (!ok) {
      std::fprintf(stderr, "teal_decode_bench: bad value for %s\n", a.c_str());
      return 2;
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "teal_decode_bench: give at least one --model\n");
    return 2;
  }
  if (profile_path.empty()) {
    std::printf("kernels: %s; teal: per-token top-k %.2f on q k v o gate up down\n",
                bench::KernelFamily(), sparsity);
  } else {
    std::printf("kernels: %s; teal: calibrated cuts for target %.2f from %s\n",
                bench::KernelFamily(), sparsity, profile_path.c_str());
  }
  std::printf("%-28s %6s %7s %10s %10s %8s %10s %9s\n", "model", "type", "threads", "dense t/s",
              "teal t/s", "ratio", "skipped", "copy MiB");
  for (const std::string& path : models) {
    // The dense rounds are the product's dense mode, which multiplies the FFN from its
    // interleaved copy; TEAL's rounds read their own transposed copies (and the prompt's dense
    // rows the interleaved ones). With the row layout the dense rounds ran slower at Q4_0, and
    // TEAL's ratio read high.
    auto model = bench::LoadForDenseDecode(path);
    if (!model.ok()) {
      std::fprintf(stderr, "teal_decode_bench: %s\n",
                   std::string(model.status().message()).c_str());
      return 1;
    }
    const ModelConfig& c = (*model)->config();
    auto kv = KvCache::Create(
        c, 1, std::min<int64_t>(c.context_length, bench::kPrompt + tokens + 1), GgmlType::kF32);
    if (!kv.ok()) {
      std::fprintf(stderr, "teal_decode_bench: %s\n", std::string(kv.status().message()).c_str());
      return 1;
    }
    absl::StatusOr<TealPlan> plan = TealPlan::TopShare(c.n_layers, sparsity);
    if (!profile_path.empty()) {
      absl::StatusOr<TealProfile> profile = ReadTealProfile(profile_path, &c);
      plan = profile.ok() ? profile->PlanFor(sparsity) : profile.status();
    }
    if (!plan.ok()) {
      std::fprintf(stderr, "teal_decode_bench: %s\n", std::string(plan.status().message()).c_str());
      return 1;
    }
    for (int nt : threads) {
      ThreadPool pool(nt);
      auto teal = TealLinear::Create(**model, *plan, pool, teal_options);
      if (!teal.ok()) {
        std::fprintf(stderr, "teal_decode_bench: %s\n",
                     std::string(teal.status().message()).c_str());
        return 1;
      }
      ForwardPass dense_pass(**model, *kv, pool);
      ForwardPass teal_pass(**model, *kv, pool, nullptr, teal->get());
      ForwardPassRunner dense_runner(dense_pass), teal_runner(teal_pass);
      std::vector<double> dense_times, teal_times;
      auto decode = [&](ForwardPassRunner& runner, std::vector<double>& times) {
        std::vector<int32_t> out;
        const absl::Status st = bench::Decode(runner, tokens, times, out);
        if (!st.ok())
          std::fprintf(stderr, "teal_decode_bench: %s\n", std::string(st.message()).c_str());
        return st.ok();
      };
      for (int r = 0; r < rounds; ++r) {
        if (!decode(dense_runner, dense_times) || !decode(teal_runner, teal_times)) return 1;
      }
      const double dense_tps = 1.0 / bench::Median(dense_times);
      const double teal_tps = 1.0 / bench::Median(teal_times);
      const std::string name = path.substr(path.find_last_of('/') + 1);
      std::printf("%-28s %6s %7d %10.2f %10.2f %8.3f %10.3f %9.1f\n", name.c_str(),
                  (*model)->weight_type_name().c_str(), nt, dense_tps, teal_tps,
                  teal_tps / dense_tps, (*teal)->MeasuredSparsity(),
                  (*teal)->owned_bytes() / double(1 << 20));
      std::fflush(stdout);
    }
  }
  return 0;
}
