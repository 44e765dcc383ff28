#include "shared/runtime/corpus.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "shared/util/progress.h"
#include "shared/util/status_macros.h"

namespace thermocline {

absl::StatusOr<std::vector<int32_t>> TokenizeCorpusFile(const std::string& path,
                                                        const Tokenizer& tokenizer,
                                                        int64_t max_tokens) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("corpus ", path, ": cannot open"));
  std::string text;
  if (max_tokens > 0) {
    // A token covers at least one byte, and rarely more than ~16: read only what can be used.
    text.resize(static_cast<size_t>(max_tokens) * 16);
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
  } else {
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("corpus ", path, ": read error"));
  std::vector<int32_t> tokens = tokenizer.Encode(text, /*add_bos=*/false);
  if (max_tokens > 0 && static_cast<int64_t>(tokens.size()) > max_tokens) tokens.resize(max_tokens);
  if (tokens.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("corpus ", path, ": fewer than 2 tokens"));
  }
  return tokens;
}

absl::StatusOr<int64_t> RunCorpusWindows(
    ForwardPass& pass, std::span<const int32_t> tokens, const CorpusWindowOptions& options,
    const std::function<void(std::span<const int32_t>, std::span<const float>)>& on_window) {
  const int64_t window = options.window;
  if (window < 2 || window > pass.kv_cache().capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("corpus window ", window,
                                                   " must be in [2, ", pass.kv_cache().capacity(),
                                                   "] (the KV cache capacity)"));
  }
  const int64_t per_window = window - 1;
  const int64_t n_windows = static_cast<int64_t>(tokens.size()) / per_window;
  if (n_windows == 0) {
    return absl::InvalidArgumentError(absl::StrCat("corpus has ", tokens.size(),
                                                   " tokens, fewer than one window of ",
                                                   per_window));
  }
  const int64_t vocab = pass.model().config().vocab_size;
  const int64_t batch_size = std::max<int64_t>(1, options.batch);
  std::unique_ptr<ProgressBar> progress;
  if (!options.progress_label.empty()) {
    progress = std::make_unique<ProgressBar>(options.progress_label, n_windows * per_window, "tokens");
  }
  std::vector<int32_t> win(window);
  std::vector<float> logits, all_logits;
  std::vector<BatchEntry> batch;
  for (int64_t w = 0; w < n_windows; ++w) {
    win[0] = pass.model().tokenizer().bos();
    std::copy_n(tokens.begin() + w * per_window, per_window, win.begin() + 1);
    pass.kv_cache().Reset(0);
    all_logits.clear();
    for (int64_t begin = 0; begin < window; begin += batch_size) {
      const int64_t end = std::min(window, begin + batch_size);
      batch.clear();
      for (int64_t p = begin; p < end; ++p) {
        batch.push_back({0, static_cast<int32_t>(p), win[p], options.want_logits});
      }
      TC_RETURN_IF_ERROR(pass.Run(batch, logits));
      all_logits.insert(all_logits.end(), logits.begin(), logits.end());
    }
    on_window(win, options.want_logits ? std::span<const float>(all_logits.data(), window * vocab)
                                       : std::span<const float>());
    if (progress) progress->Update((w + 1) * per_window);
  }
  if (progress) progress->Finish();
  return n_windows;
}

absl::StatusOr<PerplexityResult> Perplexity(ForwardPass& pass, std::span<const int32_t> tokens,
                                            const CorpusWindowOptions& options) {
  CorpusWindowOptions opts = options;
  opts.want_logits = true;
  const int64_t vocab = pass.model().config().vocab_size;
  double nll = 0;
  int64_t count = 0;
  TC_ASSIGN_OR_RETURN(
      int64_t windows,
      RunCorpusWindows(pass, tokens, opts, [&](std::span<const int32_t> win, std::span<const float> logits) {
        for (size_t p = 0; p + 1 < win.size(); ++p) {
          const float* row = logits.data() + p * vocab;
          float max_v = row[0];
          for (int64_t i = 1; i < vocab; ++i) max_v = std::max(max_v, row[i]);
          double sum = 0;
          for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i] - max_v));
          nll += std::log(sum) + max_v - row[win[p + 1]];
          ++count;
        }
      }));
  PerplexityResult r;
  r.windows = windows;
  r.predicted = count;
  r.mean_nll = nll / static_cast<double>(count);
  r.perplexity = std::exp(r.mean_nll);
  return r;
}

}  // namespace thermocline
