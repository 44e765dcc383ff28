// Per-token cost of the structured-output mask (shared/grammar/token_mask.h): the vocabulary
// trie against the baseline of decoding every token and asking the matcher (what a mask
// without the trie costs), in the same run, on real vocabularies.
//
//   grammar_mask_bench [VOCAB.gguf ...]   (default: ../shared/tokenizers' llama-spm (32k),
//                                           gpt-2 (50k) and deepseek-llm (100k) vocabularies)
//
// The steps follow one JSON document of a small schema, token by token: at each step the
// token taken is the allowed one covering the most of the remaining text, so the states are
// those a real generation passes through (inside strings, between members, in numbers).
// The trie walk runs warm (one MaskComputer for the whole document, as a sequence has) and cold
// (a fresh one per step: no state remembered from earlier steps). All masks are compared at
// every step; a difference aborts the run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "shared/grammar/gbnf.h"
#include "shared/grammar/json_schema.h"
#include "shared/grammar/matcher.h"
#include "shared/grammar/token_mask.h"
#include "shared/tokenizer/tokenizer.h"

namespace thermocline::grammar {
namespace {

constexpr const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string"},
  "tags":{"type":"array","items":{"type":"string"}},"score":{"type":"number"},
  "active":{"type":"boolean"}},"required":["name","age","tags","active"]})";
constexpr const char* kDocument =
    R"({"name": "Ada Lovelace","age": 36,"email": "ada@example.org","tags": ["math", )"
    R"("poetry","engines"],"score": 99.5,"active": true})";

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

int Run(const std::string& path) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), std::string(tok.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::string> gbnf = JsonSchemaToGbnf(kSchema);
  absl::StatusOr<Grammar> parsed = ParseGbnf(gbnf.value());
  auto g = std::make_shared<const Grammar>(parsed.value());
  const auto t_build = std::chrono::steady_clock::now();
  VocabTrie trie(*tok);
  const double build_ms = Ms(std::chrono::steady_clock::now() - t_build);

  Matcher m(g);
  MaskComputer masks(g);
  std::vector<uint8_t> mask, cold_mask;
  double cold_ms = 0;
  const std::string doc = kDocument;
  size_t at = 0;
  int steps = 0;
  double trie_ms = 0, brute_ms = 0, worst_trie = 0;
  int64_t allowed_total = 0;
  while (at < doc.size()) {
    // Cold: a computer that has seen no state of this grammar yet (the first step of a request).
    auto tc = std::chrono::steady_clock::now();
    MaskComputer(g).Compute(m.state(), trie, &cold_mask);
    cold_ms += Ms(std::chrono::steady_clock::now() - tc);
    auto t0 = std::chrono::steady_clock::now();
    const int32_t n = masks.Compute(m.state(), trie, &mask);
    auto t1 = std::chrono::steady_clock::now();
    if (cold_mask != mask) {
      std::fprintf(stderr, "%s: the cold and warm masks differ at step %d\n", path.c_str(), steps);
      return 1;
    }
    int32_t best = -1;
    size_t best_len = 0;
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
      const std::string bytes = tok->TokenBytes(-1, id);
      Matcher ref = m;
      const bool ok = !bytes.empty() && ref.Accept(bytes);
      if (ok != (mask[id] != 0)) {
        std::fprintf(stderr, "%s: the masks differ at token %d, step %d\n", path.c_str(), id,
                     steps);
        return 1;
      }
      if (ok && bytes.size() > best_len && doc.compare(at, bytes.size(), bytes) == 0) {
        best = id;
        best_len = bytes.size();
      }
    }
    auto t2 = std::chrono::steady_clock::now();
    trie_ms += Ms(t1 - t0);
    worst_trie = std::max(worst_trie, Ms(t1 - t0));
    brute_ms += Ms(t2 - t1);
    allowed_total += n;
    ++steps;
    if (best < 0) {
      std::fprintf(stderr, "%s: no allowed token continues the document at byte %zu\n",
                   path.c_str(), at);
      return 1;
    }
    m.Accept(tok->TokenBytes(-1, best));
    at += best_len;
  }
  std::printf("%-28s vocab %6d  trie nodes %7zu (built in %6.1f ms)  steps %3d  "
              "allowed/step %7.0f  mask %7.3f ms/token (worst %7.3f; cold cache %7.3f)  "
              "brute force %8.3f ms/token  ratio %6.1fx (cold %5.1fx)  complete %s\n",
              path.substr(path.rfind('/') + 1).c_str(), tok->vocab_size(), trie.node_count(),
              build_ms, steps, static_cast<double>(allowed_total) / steps, trie_ms / steps,
              worst_trie, cold_ms / steps, brute_ms / steps, brute_ms / trie_ms,
              brute_ms / cold_ms, m.IsComplete() ? "yes" : "no");
  return 0;
}

}  // namespace
}  // namespace thermocline::grammar

int main(int argc, char** argv) {
  std::vector<std::string> paths(argv + 1, argv + argc);
  if (paths.empty()) {
    for (const char* v : {"llama-spm", "gpt-2", "deepseek-llm"}) {
      paths.push_back(std::string("../shared/tokenizers/ggml-vocab-") + v + ".gguf");
    }
  }
  int rc = 0;
  for (const std::string& p : paths) rc |= thermocline::grammar::Run(p);
  return rc;
}
