// The architecture references of ../shared/models/archs/ (README there): which models, where
// their files are, and the prompt-then-greedy run every reference test drives (the CPU's in
// tests/integration/arch_reference_test.cc, the cuda backend's in tests/gpu/).
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/driver/split_engine.h"
#include "shared/runtime/forward.h"
#include "shared/runtime/generate.h"
#include "tests/test_support.h"

namespace thermocline::testing {

inline constexpr int64_t kVocab = 512;
inline constexpr int kGreedy = 16;

struct ArchCase {
  const char* name;
  bool gelu;
};

inline constexpr ArchCase kArchCases[] = {
    {"llama-rope-llama3", false},
    {"llama-rope-yarn", false},
    {"llama-rope-linear", false},
    {"llama-gqa-headdim", false},
    {"llama-moe", false},
    {"qwen2", false},
    {"qwen2moe", false},
    {"olmo2", false},
    {"gemma2", true},
    {"phi3", false},
    {"starcoder2", true},
    {"falcon", true},
};

// The test name of a case: its model's name with '-' as '_'.
inline std::string ArchCaseName(const ::testing::TestParamInfo<ArchCase>& info) {
  std::string n = info.param.name;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

inline std::string ArchPath(const std::string& file) { return testing::ModelPath("archs/" + file); }

inline std::vector<int32_t> Ints(const std::string& text) {
  std::istringstream in(text);
  std::vector<int32_t> v;
  int32_t x;
  while (in >> x) v.push_back(x);
  return v;
}

// "greedy 16: 391 97 ..." on the first line of X.greedy.txt.
inline std::vector<int32_t> ReferenceGreedy(const std::string& name) {
  const std::string text = testing::ReadFileOrDie(ArchPath(name + ".greedy.txt"));
  const std::string first = text.substr(0, text.find('\n'));
  return Ints(first.substr(first.find(':') + 1));
}

inline int32_t Argmax(const float* x) {
  return static_cast<int32_t>(std::max_element(x, x + kVocab) - x);
}

// The split engine over the two worker processes for an architecture reference: one slot of
// 64 positions, `hot` of each layer's (or expert's) neurons on the gpu worker.
inline driver::SplitEngineOptions ArchSplitOptions(const std::string& path,
                                                   const ModelConfig& config, double hot,
                                                   const std::string& instance) {
  driver::SplitEngineOptions o;
  o.instance = instance;
  o.model_path = path;
  o.config = config;
  o.hot_fraction = hot;
  o.kv_slots = 1;
  o.context = 64;
  o.bindir = BinDir();
  return o;
}

// The prompt batch, then greedy single-token steps: all prompt logits, and the logits behind
// each greedy pick (row 0 = last prompt row).
struct RunOutput {
  std::vector<float> prompt;
  std::vector<float> steps;
  std::vector<int32_t> greedy;
};

inline RunOutput RunGreedy(BatchRunner& runner, const std::vector<int32_t>& ids) {
  RunOutput out;
  std::vector<BatchEntry> batch;
  for (size_t p = 0; p < ids.size(); ++p) {
    batch.push_back({0, static_cast<int32_t>(p), ids[p], true});
  }
  EXPECT_TRUE(runner.Run(batch, out.prompt).ok());
  if (out.prompt.size() != ids.size() * kVocab) return out;
  std::vector<float> row(out.prompt.end() - kVocab, out.prompt.end());
  for (int s = 0; s < kGreedy; ++s) {
    out.steps.insert(out.steps.end(), row.begin(), row.end());
    const int32_t pick = Argmax(row.data());
    out.greedy.push_back(pick);
    if (s + 1 == kGreedy) break;
    BatchEntry e{0, static_cast<int32_t>(ids.size() + s), pick, true};
    row.clear();
    EXPECT_TRUE(runner.Run({&e, 1}, row).ok());
    if (row.size() != static_cast<size_t>(kVocab)) return out;
  }
  return out;
}

}  // namespace thermocline::testing
