// Running a model over a text corpus in fixed windows: the common loop of `perplexity`,
// `profile` and `train-predictor`.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shared/runtime/forward.h"
#include "shared/tokenizer/tokenizer.h"

namespace thermocline {

// Reads a UTF-8 text file and tokenizes it as one stream (no BOS). At most max_tokens tokens
// are kept (0 = all). Errors name the file; an empty corpus is an error.
absl::StatusOr<std::vector<int32_t>> TokenizeCorpusFile(const std::string& path,
                                                        const Tokenizer& tokenizer,
                                                        int64_t max_tokens = 0);

struct CorpusWindowOptions {
  int64_t window = 256;        // positions per window, BOS included; at most the KV capacity
  bool want_logits = true;     // logits of every position (perplexity); off for profiling
  int64_t batch = 256;         // positions per forward call
  std::string progress_label;  // non-empty: show a progress bar with ETA on stderr
};

// Splits `tokens` into consecutive windows of window-1 tokens, each run from position 0 of
// slot 0 with BOS in front. on_window(window_tokens, logits) receives the window's tokens (BOS
// first) and, when want_logits, their logits [n][vocab] (row p predicts token p+1).
// Returns the number of windows run.
absl::StatusOr<int64_t> RunCorpusWindows(
    ForwardPass& pass, std::span<const int32_t> tokens, const CorpusWindowOptions& options,
    const std::function<void(std::span<const int32_t>, std::span<const float>)>& on_window);

struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;   // nats per predicted token
  int64_t predicted = 0;  // tokens scored
  int64_t windows = 0;
};

// exp(mean negative log-likelihood) of every token after the first of each window.
absl::StatusOr<PerplexityResult> Perplexity(ForwardPass& pass, std::span<const int32_t> tokens,
                                            const CorpusWindowOptions& options);

}  // namespace thermocline
