// The gRPC face of the gateway: thermocline.v1.Generation over the scheduler. Handlers run on
// gRPC's threads; they validate, queue, and forward the scheduler's messages to the caller.
//
// The unary methods are registered raw (their request's bytes): gRPC's generated unary handlers
// parse through protobuf::MessageLite, past proto/request_serialization.h, and would answer a
// request with invalid UTF-8 in a string field INTERNAL with no details. Parsed here with
// DeserializeRequest, it is INVALID_ARGUMENT naming the field. Generate and Chat (server
// streaming) parse through the specializations in that header.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "gateway/scheduler.h"
#include "gateway/validate.h"
#include "gateway/write_watchdog.h"
#include "shared/tokenizer/tokenizer.h"
#include "thermocline/v1/generation.grpc.pb.h"

namespace thermocline::gateway {

class GenerationService final
    : public v1::Generation::WithRawCallbackMethod_Tokenize<
          v1::Generation::WithRawCallbackMethod_Detokenize<
              v1::Generation::WithRawCallbackMethod_GetModelInfo<v1::Generation::Service>>> {
  // OK, or UNAUTHENTICATED when a token is required and the call lacks it.
  grpc::Status Authorize(const grpc::ServerContextBase* context) const;
  // One raw unary call: authorize, parse, `handle`, serialize the reply.
  template <class Request, class Response>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                  grpc::Status (GenerationService::*handle)(const Request&,
                                                                            Response*));
  grpc::Status DoTokenize(const v1::TokenizeRequest& request, v1::TokenizeResponse* response);
  grpc::Status DoDetokenize(const v1::DetokenizeRequest& request,
                            v1::DetokenizeResponse* response);
  grpc::Status DoGetModelInfo(const v1::GetModelInfoRequest& request, v1::ModelInfo* response);
  // Generate and Chat after parsing: admission (--max-concurrent), `validate` (which builds the
  // Job), the scheduler, and the stream back to the caller.
  // n choices (0: 1; at most kMaxChoices) share one prompt; `seeded`: the request gave its seed.
  grpc::Status Serve(grpc::ServerContext* context, const std::string& request_id,
                     const std::function<absl::StatusOr<Job>()>& validate,
                     grpc::ServerWriter<v1::GenerateResponse>* writer, int32_t n, bool seeded);

 public:
  // `tokenizer` must outlive the service; `info` is what GetModelInfo answers, completed here
  // with the tokenizer's kind and special tokens, whether `model_chat` has a template, and the
  // chat limits. `model_chat`: the model's chat template (PrepareModelChat).
  GenerationService(const Tokenizer& tokenizer, RequestLimits limits, v1::ModelInfo info,
                    ModelChat model_chat);

  // Set once the model is loaded and the workers are ready; until then Generate answers
  // UNAVAILABLE ("loading"). The scheduler must outlive the server's handlers.
  void SetScheduler(Scheduler* scheduler) { scheduler_.store(scheduler); }

  // --auth-token-file: every call of this service must carry "authorization: Bearer <token>"
  // or gets UNAUTHENTICATED. Set before the server starts; empty (the default) = no check.
  // The health service stays open: probes learn only SERVING / NOT_SERVING from it.
  void SetAuthToken(std::string token) { auth_token_ = std::move(token); }
  // --max-concurrent: Generate calls in flight at most (queued, running, or still writing to a
  // slow reader); more are refused with RESOURCE_EXHAUSTED. Each holds a gRPC thread for its
  // whole life, so this bounds the threads and buffers that callers can pin. Set before the
  // server starts.
  void SetMaxConcurrent(int32_t n) { max_concurrent_ = n; }
  // --write-timeout: a streamed message whose write stays blocked this long (a reader that
  // reads nothing) cancels its call (WriteWatchdog). Set before the server starts.
  void SetWriteTimeout(absl::Duration timeout) {
    write_watchdog_ = std::make_unique<WriteWatchdog>(timeout);
  }

  // What the HTTP API (gateway/http_api.h) shares with the gRPC calls, so that both validate
  // with the same limits, count against the same --max-concurrent and reach the same scheduler.
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const RequestLimits& limits() const { return limits_; }
  const ModelChat& model_chat() const { return model_chat_; }
  const v1::ModelInfo& info() const { return info_; }
  const std::string& auth_token() const { return auth_token_; }
  // One call's place under --max-concurrent, held while the object lives.
  class CallPlace {
   public:
    explicit CallPlace(std::atomic<int32_t>& n) : n_(n) {}
    ~CallPlace() { n_.fetch_sub(1); }
    CallPlace(const CallPlace&) = delete;
    CallPlace& operator=(const CallPlace&) = delete;

   private:
    std::atomic<int32_t>& n_;
  };
  // RESOURCE_EXHAUSTED naming --max-concurrent when that many calls are in flight.
  absl::StatusOr<std::unique_ptr<CallPlace>> EnterCall();
  // A validated Job to the scheduler as the n choices of one request (`job` as validated;
  // seed given or not): arrival time and (when it has none) a request id are set here;
  // UNAVAILABLE while loading, else what Scheduler::SubmitAll answers. Choice i samples
  // with seed + i (given) or a seed of its own, is named request_id + "-" + i for i > 0, and
  // with n > 1 all share the prompt's KV blocks (Job::share_group). Queued together, all or
  // none; the first choice's request id goes to *request_id.
  absl::StatusOr<std::vector<std::shared_ptr<Stream>>> SubmitChoices(const Job& job, int32_t n,
                                                                     bool seeded,
                                                                     absl::Time arrival,
                                                                     std::string* request_id);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Chat(grpc::ServerContext* context, const v1::ChatRequest* request,
                    grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

 private:
  const Tokenizer& tokenizer_;
  const RequestLimits limits_;
  const v1::ModelInfo info_;
  const ModelChat model_chat_;
  std::string auth_token_;
  std::atomic<Scheduler*> scheduler_{nullptr};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> next_group_{1};
  int32_t max_concurrent_ = 0;  // 0: no limit
  std::atomic<int32_t> in_flight_{0};
  std::unique_ptr<WriteWatchdog> write_watchdog_ =
      std::make_unique<WriteWatchdog>(absl::ZeroDuration());
};

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpc(const absl::Status& status);

// Whether a call that gRPC reports cancelled was ended by its deadline rather than by its
// caller. gRPC fires the deadline on its own clock, and the system_clock reading taken right
// after can still be a little short of the deadline it reports (seen: a queued request's 100 ms
// deadline logged as "cancelled by the caller"), so a deadline within kDeadlineClockSlack of
// `now` counts as passed. A caller that cancels that close to its own deadline is counted as
// timed out, which is what it would have been a moment later.
inline constexpr std::chrono::milliseconds kDeadlineClockSlack{20};
bool DeadlineHasPassed(std::chrono::system_clock::time_point deadline,
                       std::chrono::system_clock::time_point now);

}  // namespace thermocline::gateway
