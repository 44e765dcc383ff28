// Decode throughput of other architectures next to llama at the same size, in one run: a dense
// llama, a dense qwen2 (the same block plus q/k/v biases and NeoX RoPE), a Mixtral-style llama
// MoE and a qwen2moe (shared expert + routed experts) whose experts together are as wide as the
// dense FFN. The models are synthesized at run time (model/synth.h) into a temporary directory
// and removed afterwards. Rounds rotate through the models so that all of them see the same
// machine state; each round decodes --tokens tokens after an 8-token prompt. Prints each
// model's median tokens/s, its median per-round ratio to llama (the figure of merit: raw
// tokens/s on a shared machine are noisy), the ratio the weight bytes a token reads would
// predict for a memory-bound decode, and the load average before and after.
//
// The shapes are those of the ~1.3B benchmark model (dim 2048, ffn 5504, vocab 32000); the
// default --layers 4 keeps a run to about a minute on 2 cores, --layers 24 is the full size.
//
// Usage: arch_decode_bench [--layers 4] [--rounds 5] [--tokens 16] [--threads 2] [--type f16]
//                          [--dir D] [--keep]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/decode_loop.h"
#include "shared/gguf/ggml_type.h"
#include "shared/model/model.h"
#include "shared/model/synth.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"
#include "shared/runtime/kv_cache.h"
#include "shared/util/cpu_features.h"

using namespace thermocline;
using bench::Decode;
using bench::kPrompt;
using bench::Median;

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: arch_decode_bench [--layers 4] [--rounds 5] [--tokens 16] [--threads 2] "
               "[--type f16] [--dir D] [--keep]\n");
  return 2;
}

struct Entry {
  std::string label;
  SynthOptions options;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<ForwardPass> pass;
  std::unique_ptr<ForwardPassRunner> runner;
  std::vector<double> tps;  // per round
};

}  // namespace

int main(int argc, char** argv) {
  int layers = 4, rounds = 5, tokens = 16, threads = 2;
  std::string type_name = "f16", dir;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--keep") {
      keep = true;
      continue;
    }
    if (i + 1 >= argc) return Usage();
    const char* v = argv[++i];
    bool ok = true;
    if (a == "--layers") {
      ok = absl::SimpleAtoi(v, &layers) && layers >= 1;
    } else if (a == "--rounds") {
      ok = absl::SimpleAtoi(v, &rounds) && rounds >= 1;
    } else if (a == "--tokens") {
      ok = absl::SimpleAtoi(v, &tokens) && tokens >= 1;
    } else if (a == "--threads") {
      ok = absl::SimpleAtoi(v, &threads) && threads >= 1;
    } else if (a == "--type") {
      type_name = v;
    } else if (a == "--dir") {
      dir = v;
    } else {
      ok = false;
    }
    if (!ok) return Usage();
  }
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "arch_decode_bench: %s\n", msg.c_str());
    return 1;
  };
  const std::optional<GgmlType> type = TypeFromName(type_name);
  if (!type || !IsWeightType(*type)) return fail("--type '" + type_name + "' is not a weight type");
  bool made_dir = false;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/arch_decode_bench.XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) return fail("cannot create a directory under " + templ);
    dir = templ;
    made_dir = true;
  }

  SynthOptions base;
  base.dim = 2048;
  base.ffn = 5504;
  base.layers = layers;
  base.heads = 16;
  base.kv_heads = 16;
  base.vocab = 32000;
  base.context = 2048;
  base.type = *type;
  base.threads = threads;
  std::vector<Entry> models(4);
  models[0].label = "llama";
  models[0].options = base;
  models[1].label = "qwen2";
  models[1].options = base;
  models[1].options.arch = "qwen2";
  // 8 experts of 704 (5632 neurons in all, 2% over the dense 5504), 2 per token.
  models[2].label = "llama-moe 8x704 top2";
  models[2].options = base;
  models[2].options.ffn = 704;
  models[2].options.experts = 8;
  models[2].options.experts_used = 2;
  // A shared expert of 1408 plus 6 routed experts of 704: 5632 neurons, 2816 per token.
  models[3].label = "qwen2moe 1408+6x704 top2";
  models[3].options = base;
  models[3].options.arch = "qwen2moe";
  models[3].options.ffn = 1408;
  models[3].options.expert_ffn = 704;
  models[3].options.experts = 6;
  models[3].options.experts_used = 2;

  std::printf("kernels %s, %d threads, %s weights, %d layers, load average %s\n",
              SimdLevelName(DetectSimdLevel()), threads, type_name.c_str(), layers,
              bench::LoadNow().c_str());
  ThreadPool pool(threads);
  const int64_t context = kPrompt + tokens + 1;
  for (size_t m = 0; m < models.size(); ++m) {
    Entry& e = models[m];
    const std::string path = absl::StrCat(dir, "/m", m, ".gguf");
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = WriteSynthModel(e.options, path); !s.ok()) {
      return fail(std::string(s.message()));
    }
    auto model = Model::Load(path);
    if (!model.ok()) return fail(std::string(model.status().message()));
    e.model = std::move(*model);
    auto kv = KvCache::Create(e.model->config(), 1, context, GgmlType::kF32);
    if (!kv.ok()) return fail(std::string(kv.status().message()));
    e.kv = std::make_unique<KvCache>(std::move(*kv));
    e.pass = std::make_unique<ForwardPass>(*e.model, *e.kv, pool);
    e.runner = std::make_unique<ForwardPassRunner>(*e.pass);
    // One untimed decode pages the weights in.
    std::vector<double> t;
    std::vector<int32_t> out;
    if (absl::Status s = Decode(*e.runner, tokens, t, out); !s.ok()) {
      return fail(std::string(s.message()));
    }
    std::printf("synthesized and warmed %-26s %6.0fM parameters, %7.1f MB read per token, %.1f s\n",
                e.label.c_str(), SynthParameterCount(e.options) / 1e6,
                e.model->decode_bytes_per_token() / 1e6,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }

  for (int r = 0; r < rounds; ++r) {
    // Rotating the order spreads any drift within a round over every model.
    for (size_t i = 0; i < models.size(); ++i) {
      Entry& e = models[(i + r) % models.size()];
      std::vector<double> t;
      std::vector<int32_t> out;
      if (absl::Status s = Decode(*e.runner, tokens, t, out); !s.ok()) {
        return fail(std::string(s.message()));
      }
      double sum = 0;
      for (double x : t) sum += x;
      e.tps.push_back(tokens / sum);
    }
    std::printf("round %d:", r + 1);
    for (const Entry& e : models) std::printf("  %s %.2f", e.label.c_str(), e.tps.back());
    std::printf(" tok/s\n");
    std::fflush(stdout);
  }

  const Entry& ref = models[0];
  std::printf("\n%-26s %10s %16s %16s\n", "model", "tok/s", "ratio to llama", "bytes predict");
  for (const Entry& e : models) {
    std::vector<double> ratios;
    for (int r = 0; r < rounds; ++r) ratios.push_back(e.tps[r] / ref.tps[r]);
    const double predicted = static_cast<double>(ref.model->decode_bytes_per_token()) /
                             static_cast<double>(e.model->decode_bytes_per_token());
    std::printf("%-26s %10.2f %16.3f %16.3f\n", e.label.c_str(), Median(e.tps), Median(ratios),
                predicted);
  }
  std::printf("load average after: %s\n", bench::LoadNow().c_str());
  models.clear();
  if (!keep) {
    std::error_code ec;
    if (made_dir) {
      std::filesystem::remove_all(dir, ec);
    } else {
      for (size_t m = 0; m < 4; ++m)
        std::filesystem::remove(absl::StrCat(dir, "/m", m, ".gguf"), ec);
    }
  } else {
    std::printf("models kept in %s\n", dir.c_str());
  }
  return 0;
}
