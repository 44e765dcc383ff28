// libFuzzer target: the gateway's request validation on a GenerateRequest, ChatRequest,
// TokenizeRequest and DetokenizeRequest parsed from arbitrary bytes (what gRPC hands the service
// after its own protobuf parse). Validation must end in OK or INVALID_ARGUMENT with a message
// (a Chat without a template: FAILED_PRECONDITION), never crash; an accepted Generate or Chat
// must respect every limit the scheduler relies on.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "gateway/validate.h"
#include "tests/fuzz/fuzz_model.h"

namespace gw = thermocline::gateway;
namespace v1 = thermocline::v1;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const thermocline::Tokenizer& tok = thermocline::fuzz::ModelTokenizer();
  gw::RequestLimits limits;
  limits.context = 256;
  limits.vocab_size = tok.vocab_size();

  auto check = [&](const absl::StatusOr<gw::Job>& job, absl::StatusCode also) {
    if (job.ok()) {
      const int64_t prompt = static_cast<int64_t>(job->prompt.size());
      if (prompt < 1 || prompt + job->max_new_tokens > limits.context) std::abort();
      for (int32_t id : job->prompt) {
        if (id < 0 || id >= limits.vocab_size) std::abort();
      }
    } else if ((job.status().code() != absl::StatusCode::kInvalidArgument &&
                job.status().code() != also) ||
               job.status().message().empty()) {
      std::abort();
    }
  };
  v1::GenerateRequest req;
  if (req.ParseFromArray(data, static_cast<int>(size))) {
    check(gw::ValidateGenerate(req, limits, tok), absl::StatusCode::kInvalidArgument);
  }
  v1::ChatRequest creq;
  if (creq.ParseFromArray(data, static_cast<int>(size))) {
    // A model without a template: only a request's own template renders.
    static const gw::ModelChat model_chat = gw::PrepareModelChat("fuzz.gguf", {});
    check(gw::ValidateChat(creq, limits, tok, model_chat), absl::StatusCode::kFailedPrecondition);
  }
  v1::TokenizeRequest treq;
  if (treq.ParseFromArray(data, static_cast<int>(size))) {
    absl::Status s = gw::ValidateTokenize(treq, limits);
    if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) std::abort();
  }
  v1::DetokenizeRequest dreq;
  if (dreq.ParseFromArray(data, static_cast<int>(size))) {
    absl::Status s = gw::ValidateDetokenize(dreq, limits);
    if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) std::abort();
  }
  return 0;
}
