#include "gateway/service.h"

#include <random>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gateway/log.h"
#include "gateway/security.h"
#include "proto/request_serialization.h"

namespace thermocline::gateway {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

bool DeadlineHasPassed(std::chrono::system_clock::time_point deadline,
                       std::chrono::system_clock::time_point now) {
  return deadline <= now + kDeadlineClockSlack;
}

namespace {

// ModelInfo's tokenizer fields, from the tokenizer itself.
v1::ModelInfo WithTokenizerInfo(v1::ModelInfo info, const Tokenizer& tok, const ModelChat& chat,
                                const RequestLimits& limits) {
  switch (tok.kind()) {
    case TokenizerKind::kSentencePiece: info.set_tokenizer_kind("spm"); break;
    case TokenizerKind::kBpe: info.set_tokenizer_kind("bpe"); break;
    case TokenizerKind::kWordPiece: info.set_tokenizer_kind("wpm"); break;
  }
  info.set_tokenizer_pre(tok.kind() == TokenizerKind::kBpe ? tok.pre() : "");
  auto special = [&tok](int32_t id, v1::SpecialToken* out) {
    out->set_id(id);
    out->set_text(tok.piece(id));
  };
  auto valid = [&tok](int32_t id) { return id >= 0 && id < tok.vocab_size(); };
  if (valid(tok.bos())) special(tok.bos(), info.mutable_bos_token());
  if (valid(tok.eos())) special(tok.eos(), info.mutable_eos_token());
  if (valid(tok.eot())) special(tok.eot(), info.mutable_eot_token());
  if (valid(tok.eom())) special(tok.eom(), info.mutable_eom_token());
  for (int32_t id : tok.eog_ids()) {
    if (valid(id)) special(id, info.add_eog_tokens());
  }
  info.set_has_chat_template(chat.has_template);
  for (const auto& [name, parsed] : chat.named) info.add_chat_template_names(name);
  info.set_max_chat_messages(limits.max_chat_messages);
  info.set_max_chat_template_bytes(limits.max_chat_template_bytes);
  return info;
}

}  // namespace

GenerationService::GenerationService(const Tokenizer& tokenizer, RequestLimits limits,
                                     v1::ModelInfo info, ModelChat model_chat)
    : tokenizer_(tokenizer),
      limits_(limits),
      info_(WithTokenizerInfo(std::move(info), tokenizer, model_chat, limits)),
      model_chat_(std::move(model_chat)) {}

grpc::Status GenerationService::Authorize(const grpc::ServerContextBase* context) const {
  if (auth_token_.empty()) return grpc::Status::OK;
  absl::Status s = CheckBearerToken(context->client_metadata(), auth_token_);
  if (!s.ok()) {
    Log(Level::kWarn, "unauthenticated", {{"peer", context->peer()},
                                          {"error", std::string(s.message())}});
  }
  return ToGrpc(s);
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context,
                                         const v1::GenerateRequest* request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  return Serve(context, request->request_id(),
               [&] { return ValidateGenerate(*request, limits_, tokenizer_); }, writer,
               request->n(), request->has_seed());
}

grpc::Status GenerationService::Chat(grpc::ServerContext* context,
                                     const v1::ChatRequest* request,
                                     grpc::ServerWriter<v1::GenerateResponse>* writer) {
  return Serve(context, request->request_id(),
               [&] { return ValidateChat(*request, limits_, tokenizer_, model_chat_); }, writer,
               request->n(), request->has_seed());
}

grpc::Status GenerationService::Serve(grpc::ServerContext* context, const std::string& request_id,
                                      const std::function<absl::StatusOr<Job>()>& validate,
                                      grpc::ServerWriter<v1::GenerateResponse>* writer, int32_t n,
                                      bool seeded) {
  const absl::Time arrival = absl::Now();
  if (grpc::Status a = Authorize(context); !a.ok()) return a;
  auto place = EnterCall();
  if (!place.ok()) return ToGrpc(place.status());
  if (n == 0) n = 1;
  auto job = n < 1 || n > kMaxChoices
                 ? absl::StatusOr<Job>(absl::InvalidArgumentError(absl::StrCat(
                       "n (choices) is ", n, "; it must be in [1, ", kMaxChoices, "]")))
                 : validate();
  if (!job.ok()) {
    Log(Level::kInfo, "request_refused", {{"request_id", request_id},
                                          {"error", std::string(job.status().message())}});
    return ToGrpc(job.status());
  }
  // One stream per choice; with n > 1 they share the prompt's KV blocks (scheduler.h).
  std::string assigned_id;
  auto submitted = SubmitChoices(*job, n, seeded, arrival, &assigned_id);
  if (!submitted.ok()) return ToGrpc(submitted.status());
  std::vector<std::shared_ptr<Stream>>& streams = *submitted;
  auto cancel_all = [&](bool deadline) {
    for (auto& s : streams) s->Cancel(deadline);
  };
  for (auto& stream : streams) {
    // A reader that reads nothing keeps Write below blocked; when the scheduler gives the
    // stream up (--stream-idle-timeout) cancelling the call is what ends that write.
    stream->SetAbandonHook([context] { context->TryCancel(); });
  }
  std::vector<bool> ended(streams.size(), false);
  size_t n_ended = 0;
  std::vector<Stream::Event> events;
  while (true) {
    // Short waits so that a cancelled call or a passed deadline is seen promptly and the
    // scheduler frees the slot at its next step boundary.
    for (size_t c = 0; c < streams.size(); ++c) {
      if (ended[c]) continue;
      streams[c]->Wait(absl::Milliseconds(streams.size() == 1 ? 20 : 5), &events);
      for (Stream::Event& ev : events) {
        if (!ev.error.ok()) {
          cancel_all(false);
          return ToGrpc(ev.error);
        }
        ev.message.set_index(static_cast<int32_t>(c));
        WriteWatchdog::Guard guard(*write_watchdog_, context);
        if (!writer->Write(ev.message)) {
          cancel_all(false);  // the caller is gone, or read nothing for --write-timeout
          if (guard.timed_out()) {
            Log(Level::kWarn, "write_timed_out",
                {{"request_id", assigned_id},
                 {"timeout_s", absl::ToDoubleSeconds(write_watchdog_->timeout())}});
            return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                "a streamed message could not be written within --write-timeout");
          }
          return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        }
        if (ev.last) {
          ended[c] = true;
          ++n_ended;
        }
      }
      events.clear();
      if (n_ended == streams.size()) return grpc::Status::OK;
    }
    if (context->IsCancelled()) {
      const bool expired = DeadlineHasPassed(context->deadline(), std::chrono::system_clock::now());
      cancel_all(expired);
      return expired ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded")
                     : grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
  }
}

absl::StatusOr<std::vector<std::shared_ptr<Stream>>> GenerationService::SubmitChoices(
    const Job& job, int32_t n, bool seeded, absl::Time arrival, std::string* request_id) {
  std::vector<Job> jobs(static_cast<size_t>(std::max(1, n)), job);
  std::string id = job.request_id;
  if (id.empty()) id = absl::StrCat("gw-", getpid(), "-", next_id_.fetch_add(1));
  *request_id = id;
  const uint64_t group = jobs.size() > 1 ? next_group_.fetch_add(1) : 0;
  std::random_device rd;
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].arrival = arrival;
    jobs[i].share_group = group;
    jobs[i].request_id = i == 0 ? id : absl::StrCat(id, "-", i);
    if (i > 0) {
      jobs[i].sampling.seed = seeded ? job.sampling.seed + static_cast<uint64_t>(i)
                                     : (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
  }
  Scheduler* scheduler = scheduler_.load();
  if (scheduler == nullptr) {
    return absl::UnavailableError("the gateway is loading the model and starting its workers");
  }
  return scheduler->SubmitAll(std::move(jobs));
}

absl::StatusOr<std::unique_ptr<GenerationService::CallPlace>> GenerationService::EnterCall() {
  const int32_t in_flight = in_flight_.fetch_add(1) + 1;
  auto place = std::make_unique<CallPlace>(in_flight_);
  if (max_concurrent_ > 0 && in_flight > max_concurrent_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many Generate and Chat calls in flight: ", max_concurrent_,
                     " (--max-concurrent) are being served; retry later"));
  }
  return place;
}

template <class Request, class Response>
grpc::ServerUnaryReactor* GenerationService::Unary(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response,
    grpc::Status (GenerationService::*handle)(const Request&, Response*)) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status s = Authorize(context);
  Request in;
  Response out;
  if (s.ok()) {
    grpc::ByteBuffer bytes(*request);  // shares the slices; DeserializeRequest consumes it
    s = v1::DeserializeRequest(&bytes, &in);
  }
  if (s.ok()) s = (this->*handle)(in, &out);
  if (s.ok()) {
    bool own_buffer = false;
    s = grpc::SerializationTraits<Response>::Serialize(out, response, &own_buffer);
  }
  reactor->Finish(s);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return Unary(context, request, response, &GenerationService::DoTokenize);
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return Unary(context, request, response, &GenerationService::DoDetokenize);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Unary(context, request, response, &GenerationService::DoGetModelInfo);
}

grpc::Status GenerationService::DoTokenize(const v1::TokenizeRequest& request,
                                           v1::TokenizeResponse* response) {
  if (absl::Status s = ValidateTokenize(request, limits_); !s.ok()) return ToGrpc(s);
  const Tokenizer& tok = tokenizer_;
  std::vector<int32_t> ids =
      tok.Encode(request.text(), EncodeOptions{.parse_special = request.parse_special()});
  if (request.add_bos() && tok.bos() >= 0) ids.insert(ids.begin(), tok.bos());
  for (int32_t id : ids) {
    response->add_token_ids(id);
    response->add_pieces(tok.piece(id));
  }
  return grpc::Status::OK;
}

grpc::Status GenerationService::DoDetokenize(const v1::DetokenizeRequest& request,
                                             v1::DetokenizeResponse* response) {
  if (absl::Status s = ValidateDetokenize(request, limits_); !s.ok()) return ToGrpc(s);
  std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
  // Decode = a StreamingDetokenizer fed every id and flushed: always valid UTF-8.
  response->set_text(tokenizer_.Decode(ids));
  return grpc::Status::OK;
}

grpc::Status GenerationService::DoGetModelInfo(const v1::GetModelInfoRequest&,
                                               v1::ModelInfo* response) {
  *response = info_;
  return grpc::Status::OK;
}

}  // namespace thermocline::gateway
