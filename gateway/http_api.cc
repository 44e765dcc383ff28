#include "gateway/http_api.h"

#include <httplib.h>
#include <sys/socket.h>

#include <charconv>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gateway/listen_address.h"
#include "gateway/log.h"
#include "gateway/openai_json.h"
#include "gateway/validate.h"

namespace thermocline::gateway {
namespace {

using Json = OpenAiJson;

// Request bodies beyond this are refused before parsing (the gRPC API's message limit).
constexpr size_t kMaxBodyBytes = 4 << 20;
// Each connection's socket send buffer (the kernel doubles it): enough for a burst of SSE
// chunks, small enough that a stalled reader is felt by the scheduler (see set_socket_options).
constexpr int kSendBufferBytes = 64 << 10;
// JSON nesting accepted in a body (a chat message's tool calls nest a few levels).
constexpr int kMaxBodyDepth = 64;
// How long a handler waits for the scheduler before it looks at its connection's state again.
constexpr absl::Duration kPoll = absl::Milliseconds(20);

// Model output and token texts are valid UTF-8 by construction; anything else (a message that
// quotes a request) is dumped with U+FFFD rather than throwing mid-response.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void Reply(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void ReplyError(httplib::Response& res, const ApiError& e) {
  Reply(res, e.http_status, ErrorBody(e));
}

ApiError Error(int status, std::string message, std::string param = "", std::string code = "") {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}


}  // namespace

namespace http_internal {

// One choice of a request (n > 1 runs one sequence per choice).
struct Choice {
  std::shared_ptr<Stream> stream;
  bool done = false;
  bool opened = false;  // a chat stream's first chunk (the role) was sent
  std::string text;
  std::vector<v1::TokenLogprob> logprobs;
  int64_t text_bytes = 0;  // completion text streamed so far (completions' text_offset)
  int64_t completion_tokens = 0;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
};

// Everything one completions call holds while it is served.
struct Call {
  CompletionRequest request;
  ResponseHeader header;
  int64_t prompt_tokens = 0;
  std::vector<Choice> choices;
  std::unique_ptr<GenerationService::CallPlace> place;
  explicit Call(std::atomic<int>& live) : live_(live) { live_.fetch_add(1); }
  ~Call() { live_.fetch_sub(1); }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  std::atomic<int>& live_;     // HttpApi::live_calls_
  std::atomic<bool> abandoned{false};  // the scheduler gave a stream up
  bool finished = false;               // the stream's last event was written
  bool logprobs = false;

  void CancelAll() {
    for (Choice& c : choices) {
      if (!c.done) c.stream->Cancel();
    }
  }
  bool AllDone() const {
    for (const Choice& c : choices) {
      if (!c.done) return false;
    }
    return true;
  }
  // Waits up to `timeout` for the scheduler's messages of any choice.
  std::vector<std::pair<size_t, Stream::Event>> Collect(absl::Duration timeout) {
    std::vector<std::pair<size_t, Stream::Event>> out;
    std::vector<Stream::Event> events;
    size_t first_live = choices.size();
    for (size_t i = 0; i < choices.size(); ++i) {
      if (choices[i].done) continue;
      if (first_live == choices.size()) first_live = i;
      choices[i].stream->Wait(absl::ZeroDuration(), &events);
      for (Stream::Event& ev : events) out.emplace_back(i, std::move(ev));
      events.clear();
    }
    if (out.empty() && first_live < choices.size()) {
      choices[first_live].stream->Wait(timeout, &events);
      for (Stream::Event& ev : events) out.emplace_back(first_live, std::move(ev));
    }
    return out;
  }
};

}  // namespace http_internal

namespace {

using http_internal::Choice;

std::vector<v1::TokenLogprob> LogprobsOf(const v1::TokenChunk& chunk) {
  return {chunk.logprobs().begin(), chunk.logprobs().end()};
}

}  // namespace

absl::Status HttpApi::Serve(const HttpOptions& options) {
  std::string host;
  int port = 0;
  if (!ParseListenAddress(options.listen, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen ", options.listen, ": not HOST:PORT with a port in [0, 65535]"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (server_ != nullptr) return absl::FailedPreconditionError("the HTTP API is already served");
  std::unique_ptr<httplib::Server> server;
  const SecurityOptions& tls = options.tls;
  if (!tls.tls_cert.empty()) {
    // The files were checked by MakeServerCredentials (their flags named on error); httplib
    // reads them again for its own context. A client CA makes client certificates mandatory.
    auto ssl = std::make_unique<httplib::SSLServer>(
        tls.tls_cert.c_str(), tls.tls_key.c_str(),
        tls.tls_client_ca.empty() ? nullptr : tls.tls_client_ca.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(
          "--http-listen: OpenSSL refused --tls-cert / --tls-key / --tls-client-ca");
    }
    server = std::move(ssl);
  } else {
    server = std::make_unique<httplib::Server>();
  }
  // A connection holds a pool thread for its whole life (a stream, or an idle keep-alive
  // connection for up to 5 s); the pool is created once, here.
  const size_t threads = static_cast<size_t>(std::max(options.threads, 4));
  server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // Without SO_REUSEPORT (httplib's default sets it): a port in use must be an error, not a
  // port shared with another gateway.
  // A bounded send buffer (accepted connections inherit it from the listener): with Linux's
  // autotuning a reader that never reads lets the kernel take up to 4 MiB of each stream
  // before a write blocks, so the scheduler's backpressure (--max-pending-messages, then
  // --stream-idle-timeout) would never see it; with this, it does within ~kSendBufferBytes.
  // The listening socket is kept (listen_fd) for its backlog, below.
  auto listen_fd = std::make_shared<int>(-1);
  server->set_socket_options([listen_fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    int sndbuf = kSendBufferBytes;
    setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    *listen_fd = sock;
  });
  server->set_payload_max_length(kMaxBodyBytes);
  if (options.write_timeout > absl::ZeroDuration()) {
    server->set_write_timeout(absl::ToChronoMicroseconds(options.write_timeout));
  } else {
    server->set_write_timeout(std::chrono::hours(24));
  }
  server->Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) {
    Completions(q, s, true);
  });
  server->Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) {
    Completions(q, s, false);
  });
  server->Get("/v1/models", [this](const httplib::Request& q, httplib::Response& s) {
    Models(q, s);
  });
  server->Post("/tokenize", [this](const httplib::Request& q, httplib::Response& s) {
    Tokenize(q, s);
  });
  server->Post("/detokenize", [this](const httplib::Request& q, httplib::Response& s) {
    Detokenize(q, s);
  });
  // Open like gRPC's health service: a probe learns only serving or not.
  auto health = [this](const httplib::Request&, httplib::Response& s) {
    const bool up = serving_.load() && !stopping_.load();
    Reply(s, up ? 200 : 503, Json{{"status", up ? "serving" : "not_serving"}});
  };
  server->Get("/health", health);
  server->Get("/ready", health);
  server->set_exception_handler(
      [](const httplib::Request& q, httplib::Response& s, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        Log(Level::kError, "http_exception", {{"path", q.path}, {"error", what}});
        ReplyError(s, Error(500, absl::StrCat("internal error: ", what), "", "internal"));
      });
  // Every other error status the library sets itself (404 no route, 413 too large, 400 a
  // malformed request line) gets an OpenAI-shaped body too.
  server->set_error_handler([](const httplib::Request& q, httplib::Response& s) {
    if (!s.body.empty()) return;
    std::string message = absl::StrCat("HTTP ", s.status);
    std::string code;
    if (s.status == 404) {
      message = absl::StrCat("no route ", q.method, " ", q.path,
                             " (POST /v1/chat/completions, POST /v1/completions, GET "
                             "/v1/models, GET /health, GET /ready, POST /tokenize, POST "
                             "/detokenize)");
      code = "unknown_route";
    } else if (s.status == 413) {
      message = absl::StrCat("the request body is larger than ", kMaxBodyBytes, " bytes");
      code = "body_too_large";
    }
    ReplyError(s, Error(s.status, message, "", code));
  });
  const int bound = port == 0 ? server->bind_to_any_port(host)
                              : (server->bind_to_port(host, port) ? port : -1);
  // Debian's cpp-httplib listens with a backlog of 5: 16 clients connecting at once lost SYNs
  // and waited a 1 s retransmission (gateway_bench). Listening again on the bound socket only
  // raises the queue (Linux caps it at net.core.somaxconn).
  if (bound >= 0 && *listen_fd >= 0) ::listen(*listen_fd, SOMAXCONN);
  if (bound < 0) {
    return absl::UnavailableError(absl::StrCat("--http-listen ", options.listen,
                                               ": cannot listen (a bad address, or the port "
                                               "is in use)"));
  }
  port_ = bound;
  httplib::Server* raw = server.get();
  server_ = std::move(server);
  thread_ = std::thread([raw] { raw->listen_after_bind(); });
  // stop() only takes effect once the listen loop runs (as in GatewayMetrics::Serve).
  while (!raw->is_running()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  Log(Level::kInfo, "http_listening",
      {{"address", absl::StrCat(host, ":", bound)}, {"tls", !tls.tls_cert.empty()}});
  return absl::OkStatus();
}

void HttpApi::Stop() {
  stopping_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  if (server_ == nullptr) return;
  // httplib's stop() ends a chunked response between two writes, so the calls first get to
  // write what the drain gave them (their Finals and [DONE]); one whose writes stay blocked is
  // cut by --write-timeout, and this wait is bounded too.
  for (int i = 0; i < 500 && live_calls_.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

HttpApi::HttpApi(GenerationService& service)
    : service_(service), started_(absl::ToUnixSeconds(absl::Now())) {}

HttpApi::~HttpApi() { Stop(); }

bool HttpApi::Authorized(const httplib::Request& req, httplib::Response& res) {
  if (service_.auth_token().empty()) return true;
  absl::Status s;
  if (req.has_header("Authorization")) {
    const std::string value = req.get_header_value("Authorization");
    const std::string_view v(value);
    s = CheckAuthorizationValue(&v, service_.auth_token(), "header");
  } else {
    s = CheckAuthorizationValue(nullptr, service_.auth_token(), "header");
  }
  if (s.ok()) return true;
  Log(Level::kWarn, "unauthenticated",
      {{"peer", absl::StrCat(req.remote_addr, ":", req.remote_port)},
       {"error", std::string(s.message())}});
  ReplyError(res, Error(401, std::string(s.message()), "", "invalid_api_key"));
  return false;
}

void HttpApi::Models(const httplib::Request& req, httplib::Response& res) {
  if (!Authorized(req, res)) return;
  const v1::ModelInfo& info = service_.info();
  Json model = {{"id", info.model()},         {"object", "model"},
                {"created", started_},        {"owned_by", "thermocline"},
                {"root", info.model()},       {"max_model_len", info.context_length()}};
  Reply(res, 200, Json{{"object", "list"}, {"data", Json::array({std::move(model)})}});
}

void HttpApi::Tokenize(const httplib::Request& req, httplib::Response& res) {
  if (!Authorized(req, res)) return;
  Json body;
  ApiError e;
  if (!ParseBody(req.body, kMaxBodyDepth, &body, &e)) return ReplyError(res, e);
  auto prompt = body.find("prompt");
  if (prompt == body.end() || !prompt->is_string()) {
    return ReplyError(res, Error(400, "prompt must be a string", "prompt", "invalid_type"));
  }
  bool add_special = true;
  if (auto a = body.find("add_special_tokens"); a != body.end() && !a->is_null()) {
    if (!a->is_boolean()) {
      return ReplyError(res, Error(400, "add_special_tokens must be a boolean",
                                   "add_special_tokens", "invalid_type"));
    }
    add_special = a->get<bool>();
  }
  v1::TokenizeRequest tr;
  tr.set_text(prompt->get<std::string>());
  if (absl::Status s = ValidateTokenize(tr, service_.limits()); !s.ok()) {
    ApiError err = FromStatus(s, "max_tokens");
    err.param = "prompt";
    return ReplyError(res, err);
  }
  // add_special_tokens: BOS (and EOS) as the vocabulary says, exactly as /v1/completions
  // tokenizes a text prompt, so `count` is that request's prompt_tokens.
  const std::vector<int32_t> ids =
      service_.tokenizer().Encode(tr.text(), EncodeOptions{.add_special = add_special});
  Reply(res, 200, Json{{"count", ids.size()},
                       {"max_model_len", service_.limits().context},
                       {"tokens", ids}});
}

void HttpApi::Detokenize(const httplib::Request& req, httplib::Response& res) {
  if (!Authorized(req, res)) return;
  Json body;
  ApiError e;
  if (!ParseBody(req.body, kMaxBodyDepth, &body, &e)) return ReplyError(res, e);
  auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) {
    return ReplyError(res, Error(400, "tokens must be an array of token ids", "tokens",
                                 "invalid_type"));
  }
  v1::DetokenizeRequest dr;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& t = (*tokens)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < INT32_MIN || t.get<int64_t>() > INT32_MAX) {
      return ReplyError(res, Error(400, absl::StrCat("tokens[", i, "] must be a token id"),
                                   "tokens", "invalid_type"));
    }
    dr.add_token_ids(static_cast<int32_t>(t.get<int64_t>()));
  }
  if (absl::Status s = ValidateDetokenize(dr, service_.limits()); !s.ok()) {
    ApiError err = FromStatus(s, "max_tokens");
    err.param = "tokens";
    return ReplyError(res, err);
  }
  std::vector<int32_t> ids(dr.token_ids().begin(), dr.token_ids().end());
  Reply(res, 200, Json{{"prompt", service_.tokenizer().Decode(ids)}});
}

void HttpApi::Completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  const absl::Time arrival = absl::Now();
  if (!Authorized(req, res)) return;
  auto call = std::make_shared<Call>(live_calls_);
  {
    Json body;
    ApiError e;
    if (!ParseBody(req.body, kMaxBodyDepth, &body, &e)) return ReplyError(res, e);
    if (!ParseCompletionRequest(body, chat, &call->request, &e)) return ReplyError(res, e);
  }
  CompletionRequest& r = call->request;
  const std::string& served = service_.info().model();
  if (!r.model.empty() && r.model != served) {
    return ReplyError(res, Error(404, absl::StrCat("the model `", r.model,
                                                   "` does not exist; this server serves `",
                                                   served, "` (GET /v1/models)"),
                                 "model", "model_not_found"));
  }
  auto place = service_.EnterCall();
  if (!place.ok()) return ReplyError(res, FromStatus(place.status(), r.max_tokens_name));
  call->place = *std::move(place);

  // The same validation as the gRPC calls, on the same proto messages.
  const std::string header_id = req.get_header_value("X-Request-Id");
  absl::StatusOr<Job> job;
  if (chat) {
    v1::ChatRequest& cr = r.chat_request;
    cr.set_request_id(header_id);
    // No max_tokens: OpenAI's chat runs to the end of the context. Validated with 1 first,
    // since the room left depends on the rendered prompt's length.
    if (!r.max_tokens_given) cr.set_max_new_tokens(1);
    job = ValidateChat(cr, service_.limits(), service_.tokenizer(), service_.model_chat());
    if (job.ok() && !r.max_tokens_given) {
      job->max_new_tokens = service_.limits().context - static_cast<int32_t>(job->prompt.size());
    }
  } else {
    v1::GenerateRequest& gr = r.generate_request;
    gr.set_request_id(header_id);
    if (!r.max_tokens_given) gr.set_max_new_tokens(16);  // OpenAI's default for completions
    job = ValidateGenerate(gr, service_.limits(), service_.tokenizer());
  }
  if (!job.ok()) {
    Log(Level::kInfo, "request_refused", {{"request_id", header_id},
                                          {"api", "http"},
                                          {"error", std::string(job.status().message())}});
    return ReplyError(res, FromStatus(job.status(), r.max_tokens_name));
  }
  call->prompt_tokens = static_cast<int64_t>(job->prompt.size());
  const bool seeded = chat ? r.chat_request.has_seed() : r.generate_request.has_seed();
  // Choice i samples with seed + i (seed given), or with a seed of its own; the choices share
  // the prompt's KV blocks (prefilled once, forked: scheduler.h).
  std::string id;
  auto streams = service_.SubmitChoices(*job, r.n, seeded, arrival, &id);
  if (!streams.ok()) return ReplyError(res, FromStatus(streams.status(), r.max_tokens_name));
  call->header.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", id);
  for (auto& stream : *streams) {
    Choice c;
    c.stream = std::move(stream);
    std::weak_ptr<Call> weak = call;
    c.stream->SetAbandonHook([weak] {
      if (auto held = weak.lock()) held->abandoned.store(true);
    });
    call->choices.push_back(std::move(c));
  }
  call->header.created = absl::ToUnixSeconds(arrival);
  call->header.model = served;
  call->logprobs = job->logprobs;
  if (r.stream) return StreamResponse(call, req, res);

  while (!call->AllDone()) {
    auto events = call->Collect(kPoll);
    // At shutdown the scheduler's drain gives every sequence its last message first (a Final
    // of FINISH_REASON_CANCELLED): only a call that got nothing is cut short.
    if (events.empty() && stopping_.load()) {
      call->CancelAll();
      return ReplyError(res, Error(503, "the gateway is shutting down", "", "unavailable"));
    }
    for (auto& [i, ev] : events) {
      if (!ev.error.ok()) {
        call->CancelAll();
        return ReplyError(res, FromStatus(ev.error, r.max_tokens_name));
      }
      Apply(*call, i, ev, /*chunk=*/nullptr);
    }
  }
  Json choices = Json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < call->choices.size(); ++i) {
    const Choice& c = call->choices[i];
    completion_tokens += c.completion_tokens;
    Json lp = nullptr;
    if (call->logprobs) {
      lp = chat ? ChatLogprobs(c.logprobs, service_.tokenizer())
                : CompletionLogprobs(c.logprobs, service_.tokenizer(), 0);
    }
    Json choice = {{"index", i}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = std::move(lp);
    choice["finish_reason"] = FinishReasonName(c.finish);
    choices.push_back(std::move(choice));
  }
  Reply(res, 200, Json{{"id", call->header.id},
                       {"object", chat ? "chat.completion" : "text_completion"},
                       {"created", call->header.created},
                       {"model", call->header.model},
                       {"choices", std::move(choices)},
                       {"usage", UsageJson(call->prompt_tokens, completion_tokens)}});
}

void HttpApi::Apply(Call& call, size_t i, const Stream::Event& ev, Json* chunk) {
  Choice& c = call.choices[i];
  const bool chat = call.request.chat;
  std::string text;
  std::vector<v1::TokenLogprob> lps;
  Json finish = nullptr;
  if (ev.message.has_chunk()) {
    const v1::TokenChunk& tc = ev.message.chunk();
    text = tc.text();
    lps = LogprobsOf(tc);
    c.completion_tokens += tc.token_ids_size();
  } else if (ev.message.has_final()) {
    const v1::Final& f = ev.message.final();
    text = f.text();
    c.finish = f.finish_reason();
    c.completion_tokens = f.usage().completion_tokens();
    c.done = true;
    finish = FinishReasonName(c.finish);
  }
  if (ev.last) c.done = true;
  if (chunk != nullptr && (!text.empty() || !lps.empty() || !finish.is_null())) {
    Json lp = nullptr;
    if (call.logprobs && !lps.empty()) {
      lp = chat ? ChatLogprobs(lps, service_.tokenizer())
                : CompletionLogprobs(lps, service_.tokenizer(), c.text_bytes);
    }
    Json choice = {{"index", i}};
    if (chat) {
      choice["delta"] = text.empty() ? Json::object() : Json{{"content", text}};
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = std::move(lp);
    choice["finish_reason"] = std::move(finish);
    *chunk = ChunkOf(call, Json::array({std::move(choice)}));
  }
  c.text_bytes += static_cast<int64_t>(text.size());
  c.text += text;
  c.logprobs.insert(c.logprobs.end(), lps.begin(), lps.end());
}

Json HttpApi::ChunkOf(const Call& call, Json choices) const {
  Json j = {{"id", call.header.id},
            {"object", call.request.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", call.header.created},
            {"model", call.header.model},
            {"choices", std::move(choices)}};
  if (call.request.include_usage) j["usage"] = nullptr;
  return j;
}

void HttpApi::StreamResponse(const std::shared_ptr<Call>& call, const httplib::Request& req,
                             httplib::Response& res) {
  // httplib would gzip a text/ response for a client that accepts it (undici's fetch, behind
  // the openai client, does), and its compressor holds output back until the end: tokens would
  // arrive all at once. The Request is the library's own non-const object, so dropping the
  // header for this response is safe.
  const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies (nginx) must not buffer the events
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, call](size_t, httplib::DataSink& sink) -> bool {
        auto send = [&sink](const Json& j) {
          const std::string line = absl::StrCat("data: ", Dump(j), "\n\n");
          return sink.write(line.data(), line.size());
        };
        auto end = [&sink] {
          static constexpr char kDone[] = "data: [DONE]\n\n";
          const bool ok = sink.write(kDone, sizeof(kDone) - 1);
          sink.done();
          return ok;
        };
        if (call->finished) return true;
        if (call->request.chat) {
          // OpenAI's first chunk of each choice names the role, before any token.
          for (size_t i = 0; i < call->choices.size(); ++i) {
            Choice& c = call->choices[i];
            if (c.opened) continue;
            c.opened = true;
            Json choice = {{"index", i},
                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}};
            if (!send(ChunkOf(*call, Json::array({std::move(choice)})))) return false;
          }
        }
        // Taken only once the previous ones are written: a connection that does not drain
        // leaves them with the scheduler, which pauses the sequence (backpressure).
        auto events = call->Collect(kPoll);
        // As above: the drain's Finals (and the abandoning error) are sent before giving up.
        if (events.empty() && (stopping_.load() || call->abandoned.load())) {
          return false;  // the releaser cancels
        }
        for (auto& [i, ev] : events) {
          if (!ev.error.ok()) {
            // The status line is long sent: the error goes in the stream, as vLLM does.
            call->CancelAll();
            call->finished = true;
            send(ErrorBody(FromStatus(ev.error, call->request.max_tokens_name)));
            return end();
          }
          Json chunk;
          Apply(*call, i, ev, &chunk);
          if (!chunk.is_null() && !send(chunk)) return false;
        }
        if (!call->AllDone()) return true;
        call->finished = true;
        if (call->request.include_usage) {
          int64_t completion_tokens = 0;
          for (const Choice& c : call->choices) completion_tokens += c.completion_tokens;
          Json last = ChunkOf(*call, Json::array());
          last["usage"] = UsageJson(call->prompt_tokens, completion_tokens);
          if (!send(last)) return false;
        }
        return end();
      },
      [call](bool) { call->CancelAll(); });  // a closed connection frees the slots
}

}  // namespace thermocline::gateway
