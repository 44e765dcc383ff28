// The gateway's OpenAI-compatible HTTP API (docs/http.md): /v1/chat/completions,
// /v1/completions (JSON, or server-sent events with `stream`), /v1/models, /health, /ready,
// /tokenize and /detokenize, served by cpp-httplib.
//
// It is a second front end of the same service: a request becomes the gRPC API's ChatRequest
// or GenerateRequest (gateway/openai_json.h), is validated by gateway/validate.h, counts against
// the same --max-concurrent, and runs on the same scheduler (hence the same metrics); bearer
// tokens and TLS are the gRPC flags'.
//
// Streaming takes the scheduler's messages only as fast as the connection writes them (each is
// written before the next is taken), so a reader that does not read makes the scheduler pause
// that sequence (--max-pending-messages) and, past --stream-idle-timeout, give it up; a write
// blocked longer than --write-timeout ends the response. A connection that closes mid-stream
// cancels the sequence, which frees its KV slot at the next step boundary.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gateway/openai_json.h"
#include "gateway/security.h"
#include "gateway/service.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace thermocline::gateway {

namespace http_internal {
struct Call;
}  // namespace http_internal

struct HttpOptions {
  std::string listen;             // "host:port"; port 0 picks a free one (port())
  SecurityOptions tls;            // all empty: plain HTTP
  absl::Duration write_timeout;   // zero: no limit
  int threads = 16;               // connections served at once
};

class HttpApi {
 public:
  // `service` supplies the limits, the tokenizer, the model's template, the token and the
  // scheduler; it must outlive this object.
  explicit HttpApi(GenerationService& service);
  ~HttpApi();
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  // Binds and serves from a thread of its own. InvalidArgument for a bad address or TLS files
  // httplib cannot load, Unavailable when the port cannot be bound.
  absl::Status Serve(const HttpOptions& options);
  int port() const { return port_; }
  // /health and /ready answer 200 only while this is true (main sets it with gRPC's health).
  void SetServing(bool serving) { serving_.store(serving); }
  // Ends every request still served (streams are cancelled, waiting handlers answer 503) and
  // stops the server; idempotent. Call before the scheduler goes away.
  void Stop();

 private:
  using Call = http_internal::Call;
  void Completions(const httplib::Request& req, httplib::Response& res, bool chat);
  // The server-sent events of a submitted call.
  void StreamResponse(const std::shared_ptr<Call>& call, const httplib::Request& req,
                      httplib::Response& res);
  // One scheduler message of choice `i` into the call's state; with `chunk`, also the stream
  // chunk to send for it (left null when it carries nothing to send).
  void Apply(Call& call, size_t i, const Stream::Event& event, OpenAiJson* chunk);
  OpenAiJson ChunkOf(const Call& call, OpenAiJson choices) const;
  void Models(const httplib::Request& req, httplib::Response& res);
  void Tokenize(const httplib::Request& req, httplib::Response& res);
  void Detokenize(const httplib::Request& req, httplib::Response& res);
  // False (with the 401 written) when a token is required and the request lacks it.
  bool Authorized(const httplib::Request& req, httplib::Response& res);

  GenerationService& service_;
  const int64_t started_;  // unix seconds: /v1/models' `created`
  std::atomic<bool> serving_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int> live_calls_{0};  // completions calls not yet done (Stop waits for them)
  std::mutex mu_;  // guards server_, thread_
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace thermocline::gateway
