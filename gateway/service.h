// The gRPC face of the gateway: thermocline.v1.Generation over the scheduler. Handlers run on
// gRPC's threads; they validate, queue, and forward the scheduler's messages to the caller.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "gateway/scheduler.h"
#include "gateway/validate.h"
#include "shared/model/model.h"
#include "thermocline/v1/generation.grpc.pb.h"

namespace thermocline::gateway {

class GenerationService final : public v1::Generation::Service {
  // OK, or UNAUTHENTICATED when a token is required and the call lacks it.
  grpc::Status Authorize(const grpc::ServerContext* context) const;

 public:
  // `model` (for the tokenizer and shapes) must outlive the service; `info` is what
  // GetModelInfo answers.
  GenerationService(const Model& model, RequestLimits limits, v1::ModelInfo info);

  // Set once the model is loaded and the workers are ready; until then Generate answers
  // UNAVAILABLE ("loading"). The scheduler must outlive the server's handlers.
  void SetScheduler(Scheduler* scheduler) { scheduler_.store(scheduler); }

  // --auth-token-file: every call of this service must carry "authorization: Bearer <token>"
  // or gets UNAUTHENTICATED. Set before the server starts; empty (the default) = no check.
  // The health service stays open: probes learn only SERVING / NOT_SERVING from it.
  void SetAuthToken(std::string token) { auth_token_ = std::move(token); }

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest* request,
                            v1::ModelInfo* response) override;

 private:
  const Model& model_;
  const RequestLimits limits_;
  const v1::ModelInfo info_;
  std::string auth_token_;
  std::atomic<Scheduler*> scheduler_{nullptr};
  std::atomic<uint64_t> next_id_{1};
};

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace thermocline::gateway
