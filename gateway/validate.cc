#include "gateway/validate.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace thermocline::gateway {
namespace {

absl::Status Bad(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// Checks a float field that must be finite and in [lo, hi] (lo_open: lo excluded). NaN fails
// every comparison, so it is named separately rather than slipping through.
absl::Status CheckFloat(const char* field, float v, float lo, float hi, bool lo_open) {
  if (!std::isfinite(v)) return Bad(absl::StrCat(field, " must be a finite number, got ", v));
  if (lo_open ? !(v > lo) : !(v >= lo)) {
    return Bad(absl::StrCat(field, " must be ", lo_open ? "> " : ">= ", lo, ", got ", v));
  }
  if (!(v <= hi)) return Bad(absl::StrCat(field, " must be <= ", hi, ", got ", v));
  return absl::OkStatus();
}

#define TC_CHECK_OK(expr)                  \
  do {                                     \
    absl::Status _s = (expr);              \
    if (!_s.ok()) return _s;               \
  } while (0)

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + static_cast<size_t>(n) >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

absl::StatusOr<Job> ValidateGenerate(const v1::GenerateRequest& r, const RequestLimits& limits,
                                     const Tokenizer& tokenizer) {
  Job job;
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText:
      if (r.text().empty()) return Bad("prompt text must not be empty");
      if (r.text().size() > static_cast<size_t>(limits.max_prompt_bytes)) {
        return Bad(absl::StrCat("prompt text must be at most ", limits.max_prompt_bytes,
                                " bytes, got ", r.text().size()));
      }
      if (!IsValidUtf8(r.text())) return Bad("prompt text must be valid UTF-8");
      // BOS (and EOS) as the vocabulary says, as llama.cpp does (gpt-2-style BPE adds none).
      job.prompt = tokenizer.Encode(r.text(), EncodeOptions{.add_special = true});
      break;
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = r.token_ids().ids();
      if (ids.empty()) return Bad("prompt token_ids must not be empty");
      if (ids.size() > limits.context) {
        return Bad(absl::StrCat("prompt token_ids has ", ids.size(),
                                " tokens, more than the context of ", limits.context));
      }
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
          return Bad(absl::StrCat("prompt token_ids[", i, "] must be in [0, ", limits.vocab_size,
                                  "), got ", ids[i]));
        }
      }
      job.prompt.assign(ids.begin(), ids.end());
      break;
    }
    default:
      return Bad("prompt is required: set text or token_ids");
  }
  const int64_t n_prompt = static_cast<int64_t>(job.prompt.size());
  if (r.max_new_tokens() < 1) {
    return Bad(absl::StrCat("max_new_tokens must be >= 1, got ", r.max_new_tokens()));
  }
  if (r.max_new_tokens() > limits.context) {
    return Bad(absl::StrCat("max_new_tokens must be <= the context of ", limits.context,
                            ", got ", r.max_new_tokens()));
  }
  if (n_prompt + r.max_new_tokens() > limits.context) {
    return Bad(absl::StrCat("prompt (", n_prompt, " tokens) + max_new_tokens (",
                            r.max_new_tokens(), ") exceeds the context of ", limits.context,
                            " positions"));
  }
  job.max_new_tokens = r.max_new_tokens();

  // Sampling: unset fields keep SamplingParams' defaults (those of `thermocline generate`).
  SamplingParams& sp = job.sampling;
  if (r.has_temperature()) {
    TC_CHECK_OK(CheckFloat("temperature", r.temperature(), 0, 1000, false));
    sp.temperature = r.temperature();
  }
  if (r.has_top_k()) {
    if (r.top_k() < 0 || r.top_k() > limits.vocab_size) {
      return Bad(absl::StrCat("top_k must be in [0, ", limits.vocab_size, "], got ", r.top_k()));
    }
    sp.top_k = r.top_k();
  }
  if (r.has_top_p()) {
    TC_CHECK_OK(CheckFloat("top_p", r.top_p(), 0, 1, true));
    sp.top_p = r.top_p();
  }
  if (r.has_min_p()) {
    TC_CHECK_OK(CheckFloat("min_p", r.min_p(), 0, 1, false));
    sp.min_p = r.min_p();
  }
  if (r.has_repetition_penalty()) {
    TC_CHECK_OK(CheckFloat("repetition_penalty", r.repetition_penalty(), 0, 100, true));
    sp.repetition_penalty = r.repetition_penalty();
  }
  if (r.has_presence_penalty()) {
    TC_CHECK_OK(CheckFloat("presence_penalty", r.presence_penalty(), -2, 2, false));
    sp.presence_penalty = r.presence_penalty();
  }
  if (r.has_frequency_penalty()) {
    TC_CHECK_OK(CheckFloat("frequency_penalty", r.frequency_penalty(), -2, 2, false));
    sp.frequency_penalty = r.frequency_penalty();
  }
  if (r.has_seed()) {
    sp.seed = r.seed();
  } else {
    // Drawn, not 0: two unseeded requests should not sample alike. Reported in Final.seed.
    std::random_device rd;
    sp.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  // The sampler's own range checks, so that the gateway never accepts what it would refuse.
  if (absl::Status s = ValidateSamplingParams(sp); !s.ok()) return Bad(std::string(s.message()));

  if (r.stop_size() > limits.max_stop_strings) {
    return Bad(absl::StrCat("stop must hold at most ", limits.max_stop_strings,
                            " strings, got ", r.stop_size()));
  }
  for (int i = 0; i < r.stop_size(); ++i) {
    const std::string& s = r.stop(i);
    if (s.empty()) return Bad(absl::StrCat("stop[", i, "] must not be empty"));
    if (s.size() > static_cast<size_t>(limits.max_stop_bytes)) {
      return Bad(absl::StrCat("stop[", i, "] must be at most ", limits.max_stop_bytes,
                              " bytes, got ", s.size()));
    }
    if (!IsValidUtf8(s)) return Bad(absl::StrCat("stop[", i, "] must be valid UTF-8"));
    job.stop.push_back(s);
  }
  if (r.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Bad(absl::StrCat("stop_token_ids must hold at most ", limits.max_stop_token_ids,
                            " ids, got ", r.stop_token_ids_size()));
  }
  for (int i = 0; i < r.stop_token_ids_size(); ++i) {
    const int32_t id = r.stop_token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Bad(absl::StrCat("stop_token_ids[", i, "] must be in [0, ", limits.vocab_size,
                              "), got ", id));
    }
    job.stop_token_ids.push_back(id);
  }
  job.ignore_eos = r.ignore_eos();

  if (r.top_logprobs() < 0 || r.top_logprobs() > limits.max_top_logprobs) {
    return Bad(absl::StrCat("top_logprobs must be in [0, ", limits.max_top_logprobs, "], got ",
                            r.top_logprobs()));
  }
  if (r.top_logprobs() > 0 && !r.logprobs()) {
    return Bad(absl::StrCat("top_logprobs (", r.top_logprobs(), ") needs logprobs = true"));
  }
  job.logprobs = r.logprobs();
  job.top_logprobs = r.top_logprobs();

  if (r.request_id().size() > static_cast<size_t>(limits.max_request_id)) {
    return Bad(absl::StrCat("request_id must be at most ", limits.max_request_id,
                            " characters, got ", r.request_id().size()));
  }
  for (char c : r.request_id()) {
    // Printable ASCII only: it goes into log lines and must not forge or break them.
    if (c < 0x21 || c > 0x7E) {
      return Bad("request_id must hold printable ASCII characters only (no spaces)");
    }
  }
  job.request_id = r.request_id();
  return job;
}

absl::Status ValidateTokenize(const v1::TokenizeRequest& r, const RequestLimits& limits) {
  if (r.text().size() > static_cast<size_t>(limits.max_prompt_bytes)) {
    return Bad(absl::StrCat("text must be at most ", limits.max_prompt_bytes, " bytes, got ",
                            r.text().size()));
  }
  if (!IsValidUtf8(r.text())) return Bad("text must be valid UTF-8");
  return absl::OkStatus();
}

absl::Status ValidateDetokenize(const v1::DetokenizeRequest& r, const RequestLimits& limits) {
  if (r.token_ids_size() > limits.context) {
    return Bad(absl::StrCat("token_ids must hold at most ", limits.context, " ids, got ",
                            r.token_ids_size()));
  }
  for (int i = 0; i < r.token_ids_size(); ++i) {
    const int32_t id = r.token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Bad(absl::StrCat("token_ids[", i, "] must be in [0, ", limits.vocab_size,
                              "), got ", id));
    }
  }
  return absl::OkStatus();
}

}  // namespace thermocline::gateway
