// One decode step's attention over one layer (every head: scores, softmax, value mix;
// shared/kernels/attention.h) in each kernel family this CPU has, against the memory read floor
// measured in the same run, for f32 and f16 KV caches at several context lengths:
//
//   attention_bench [--contexts=64,256,1024,4096] [--heads=16] [--head_dim=128]
//                   [--rounds=5] [--working_set_mib=256]
//
// One thread (ForwardPass splits a step's heads over the pool; each head is one call here). The
// layer's KV rows are laid out as the KV cache lays them out (a position's heads side by side)
// and copied to fill the working set; successive calls walk through the copies, so the rows come
// from DRAM as a model's layers do. "floor" is the KV bytes over the read bandwidth measured
// first (MeasureReadBandwidthGBs, 1 thread); "x portable" the portable family's median time over
// this family's, in the same run.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_util.h"
#include "shared/gguf/ggml_type.h"
#include "shared/kernels/attention.h"
#include "shared/kernels/dispatch.h"
#include "shared/runtime/ops.h"
#include "shared/util/cpu_features.h"
#include "shared/util/fp16.h"
#include "shared/util/membw.h"
#include "shared/util/thread_pool.h"

namespace thermocline {
namespace {

struct Options {
  std::vector<int64_t> contexts = {64, 256, 1024, 4096};
  int64_t heads = 16;
  int64_t head_dim = 128;
  int rounds = 5;
  int64_t working_set_mib = 256;
};

bool ParseFlags(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const size_t eq = a.find('=');
    if (a.substr(0, 2) != "--" || eq == std::string_view::npos) return false;
    const std::string_view key = a.substr(2, eq - 2), value = a.substr(eq + 1);
    std::vector<int64_t> v;
    if (!bench::ParseList(value, v, [](int64_t x) { return x > 0; })) return false;
    if (key == "contexts") {
      o.contexts = v;
    } else if (v.size() != 1) {
      return false;
    } else if (key == "heads") {
      o.heads = v[0];
    } else if (key == "head_dim") {
      o.head_dim = v[0];
    } else if (key == "rounds") {
      o.rounds = static_cast<int>(v[0]);
    } else if (key == "working_set_mib") {
      o.working_set_mib = v[0];
    } else {
      return false;
    }
  }
  return true;
}

struct Family {
  SimdLevel level;
  const char* name;
};
constexpr Family kFamilies[] = {
    {SimdLevel::kPortable, "portable"}, {SimdLevel::kAvx2, "avx2"}, {SimdLevel::kAvx512, "avx512"}};

// Seconds per layer (median over rounds; each round walks every copy once).
double TimeLayer(GgmlType type, const Options& o, int64_t context, const uint8_t* kv,
                 int64_t copies, int64_t copy_bytes) {
  const int64_t elem = type == GgmlType::kF16 ? 2 : 4;
  const int64_t row_bytes = o.heads * o.head_dim * elem;  // one position, every head
  std::vector<float> q(o.heads * o.head_dim, 0.01f), out(o.head_dim), scores(context);
  std::vector<const uint8_t*> k_rows(context), v_rows(context);
  const float scale = 1.0f / static_cast<float>(o.head_dim);
  std::vector<double> times;
  for (int r = 0; r < o.rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t c = 0; c < copies; ++c) {
      const uint8_t* k = kv + c * copy_bytes;
      const uint8_t* v = k + copy_bytes / 2;
      for (int64_t h = 0; h < o.heads; ++h) {
        for (int64_t t = 0; t < context; ++t) {
          k_rows[t] = k + t * row_bytes + h * o.head_dim * elem;
          v_rows[t] = v + t * row_bytes + h * o.head_dim * elem;
        }
        AttentionScores(type, q.data() + h * o.head_dim, k_rows.data(), context, o.head_dim, scale,
                        scores.data());
        Softmax(scores.data(), context);
        AttentionMix(type, scores.data(), v_rows.data(), context, o.head_dim, out.data());
      }
    }
    times.push_back(bench::Seconds(start, std::chrono::steady_clock::now()) /
                    static_cast<double>(copies));
  }
  return bench::Median(times);
}

}  // namespace
}  // namespace thermocline

int main(int argc, char** argv) {
  using namespace thermocline;
  Options o;
  if (!ParseFlags(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: attention_bench [--contexts=64,256,1024,4096] [--heads=16] "
                 "[--head_dim=128] [--rounds=5] [--working_set_mib=256]\n");
    return 2;
  }
  ThreadPool pool(1);
  const double floor_gbs = MeasureReadBandwidthGBs(pool);
  std::printf("cpu: %s, 1 thread, read floor %.1f GB/s, %lld heads x %lld, load %s\n",
              SimdLevelName(CpuSimdLevel()), floor_gbs, static_cast<long long>(o.heads),
              static_cast<long long>(o.head_dim), bench::LoadNow().c_str());
  std::printf("%-4s %7s %-9s %10s %8s %8s %10s\n", "kv", "context", "family", "us/layer", "GB/s",
              "floor", "x portable");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16}) {
    const int64_t elem = type == GgmlType::kF16 ? 2 : 4;
    for (int64_t context : o.contexts) {
      const int64_t copy_bytes = 2 * context * o.heads * o.head_dim * elem;  // K then V
      const int64_t copies = std::max<int64_t>(1, (o.working_set_mib << 20) / copy_bytes);
      bench::Buffer kv = bench::Allocate(copies * copy_bytes);
      for (int64_t i = 0; i < copies * copy_bytes / elem; ++i) {
        const float f = normal(rng);
        if (type == GgmlType::kF16) {
          const uint16_t h = Fp32ToFp16(f);
          std::memcpy(kv.data() + 2 * i, &h, 2);
        } else {
          std::memcpy(kv.data() + 4 * i, &f, 4);
        }
      }
      double portable = 0.0;
      for (const Family& f : kFamilies) {
        if (!SetSimdLevelForTesting(f.level)) continue;
        const double s = TimeLayer(type, o, context, kv.data(), copies, copy_bytes);
        if (f.level == SimdLevel::kPortable) portable = s;
        const double gbs = static_cast<double>(copy_bytes) / s / 1e9;
        std::printf("%-4s %7lld %-9s %10.1f %8.2f %8.2f %10.2f\n",
                    std::string(TypeTraits(type).name).c_str(), static_cast<long long>(context),
                    f.name, s * 1e6, gbs, gbs / floor_gbs, portable / s);
      }
    }
  }
  SetSimdLevelForTesting(DetectSimdLevel());
  return 0;
}
