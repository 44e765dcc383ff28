// The gateway's overhead. Time to first token (TTFT) and inter-token latency (ITL), p50 and
// p99, at 1, 4 and 16 concurrent streams through a real thermocline-gateway (spawn mode: it
// starts and drives the two workers), measured client-side, over both of its APIs: gRPC
// Generate and the OpenAI HTTP API (/v1/completions with server-sent events); and, in the same
// run, the same requests through the local driver (shared/driver's SplitEngine in this process, no gRPC, no scheduler), so the
// gateway's overhead is a ratio of two numbers taken on the same machine in alternating
// rounds rather than an absolute figure (the machines we share are loaded by other builds; raw
// tokens/s here mean little).
//
//   - gateway: for each concurrency N, --rounds rounds of N streams started together, each a
//     fixed prompt (token ids, so all sides see identical prompts) and --tokens greedy tokens
//     with ignore_eos (a random model emits </s> whenever it likes). TTFT = first chunk -
//     call start; ITL = the gaps between a stream's consecutive chunks (one chunk per token);
//     aggregate tokens/s = all tokens / (last chunk - first call start) of the round.
//   - HTTP (unless --no-http): the same gateway also serves --http-listen, and each round runs
//     the same N requests through it too (prompt as token ids, max_tokens, temperature 0,
//     ignore_eos, stream), read with cpp-httplib's client, one kept-alive connection per
//     stream (opened before the rounds; with TCP_NODELAY: without it httplib's request
//     write is held by Nagle, and HTTP's TTFT at 1 stream read 2.5x gRPC's instead of 1.6x
//     in one run each); a chunk is an SSE `data:` event, tokens are
//     counted from them. HTTP / gRPC is reported per round (aggregate tokens/s, TTFT and ITL
//     p50), and the streamed text must equal gRPC's.
//   - local driver, alternating round by round with the gateway's (split_bench's method: both
//     sides see the same machine state): at N=1 the same request through Generate() over a
//     SplitEngine with the gateway's worker threads and hot fraction (batch of 1); at the
//     largest N the same N prompts as one batch per step over SplitEngine::Run (prefill all,
//     then one N-entry decode step per token, greedy argmax): what the gateway's streams could
//     reach with no gRPC, sampling, text streaming or scheduling.
//   - overhead: per round, gateway / local decode tokens/s at 1 stream and gateway / local
//     aggregate tokens/s at the largest N, for each API; the median and range over the rounds
//     (1.0 = none). The sides run one after another, in an order that rotates by round.
//
// Default model: synthesized into a temporary directory with `thermocline synth` (dim 512,
// ffn 1376 relu-gated, 8 layers, 8 heads, vocab 4096, context 512, f32: 29.5 M parameters,
// 118 MB: large enough that a step is real work, not just ring hops; 5-10 ms/token split on two
// shared cores, so a full run takes about a minute). --model uses an existing file instead.
//
// Usage: gateway_bench [--model M.gguf] [--bindir DIR] [--tokens 64] [--rounds 6]
//                      [--streams 1,4,16] [--hot-fraction 0.5] [--no-http]
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "shared/driver/split_engine.h"
#include "shared/model/model.h"
#include "shared/runtime/generate.h"
#include "thermocline/v1/generation.grpc.pb.h"

extern char** environ;

using namespace thermocline;
using Clock = std::chrono::steady_clock;

namespace {

// Fixed prompts, different lengths; stream i of a round uses kPrompts[i % 16].
constexpr const char* kPrompts[] = {
    "Once upon a time", "The little dog ran to the park", "Lily wanted", "Tom and Sue went out",
    "One day, a bird sang a song for the king", "The sun was", "A big red ball",
    "Mom said it was time to go home", "There was a girl", "The cat sat on the mat and slept",
    "In the park", "Ben had a toy car that was very fast", "The old tree", "Sara liked to",
    "A small boat on a quiet lake", "The happy frog"};
constexpr int kNumPrompts = 16;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Nearest-rank percentile (p in [0, 100]).
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// One stream's timeline, whichever side produced it.
struct Stream {
  std::vector<int32_t> ids;
  Clock::time_point start;
  std::vector<Clock::time_point> arrivals;  // one per token
  std::string text;                         // the streamed text, for the HTTP/gRPC comparison
  int64_t usage_tokens = -1;                // HTTP: the usage chunk's completion_tokens
  std::string error;
};

// Latency and throughput of a set of streams run together (or one after another: `wall` is
// then the sum of their durations).
struct Summary {
  std::vector<double> ttft, itl;
  int64_t tokens = 0;
  double wall = 0;
  double decode_tps = 0;  // per stream: (tokens - 1) / (last - first token), mean over streams
};

void Add(Summary& s, const Stream& st) {
  if (st.arrivals.empty()) return;
  s.ttft.push_back(Seconds(st.start, st.arrivals.front()));
  for (size_t i = 1; i < st.arrivals.size(); ++i) {
    s.itl.push_back(Seconds(st.arrivals[i - 1], st.arrivals[i]));
  }
  s.tokens += static_cast<int64_t>(st.arrivals.size());
}

// Mean per-stream decode rate, first token excluded (that is TTFT's).
double DecodeTps(const std::vector<Stream>& streams) {
  double sum = 0;
  int n = 0;
  for (const Stream& st : streams) {
    if (st.arrivals.size() < 2) continue;
    sum += static_cast<double>(st.arrivals.size() - 1) /
           Seconds(st.arrivals.front(), st.arrivals.back());
    ++n;
  }
  return n ? sum / n : 0;
}

// One round of one side: latencies, all tokens, wall = first call start to last token, and
// the mean per-stream decode rate.
Summary RoundSummary(const std::vector<Stream>& streams) {
  Summary s;
  Clock::time_point first = streams[0].start, last = streams[0].start;
  for (const Stream& st : streams) {
    first = std::min(first, st.start);
    if (!st.arrivals.empty()) last = std::max(last, st.arrivals.back());
    Add(s, st);
  }
  s.wall = Seconds(first, last);
  s.decode_tps = DecodeTps(streams);
  return s;
}

// Adds a round to a side's total over `rounds` rounds (walls sum, decode rates average).
void Merge(Summary& total, const Summary& round, int rounds) {
  total.ttft.insert(total.ttft.end(), round.ttft.begin(), round.ttft.end());
  total.itl.insert(total.itl.end(), round.itl.begin(), round.itl.end());
  total.tokens += round.tokens;
  total.wall += round.wall;
  total.decode_tps += round.decode_tps / rounds;
}

double Aggregate(const Summary& s) {
  return s.wall > 0 ? static_cast<double>(s.tokens) / s.wall : 0;
}

void PrintRow(const std::string& side, int streams, const Summary& s) {
  std::printf("%-14s %7d %9.1f %9.1f %9.2f %9.2f %10.1f %10.1f\n", side.c_str(), streams,
              1e3 * Percentile(s.ttft, 50), 1e3 * Percentile(s.ttft, 99),
              1e3 * Percentile(s.itl, 50), 1e3 * Percentile(s.itl, 99), s.decode_tps,
              Aggregate(s));
  std::fflush(stdout);
}

// Runs argv (no shell) to completion; stdout and stderr go to `log`. Returns the exit code.
int RunProcess(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The gateway process: started on free ports, its "listening grpc=... http=..." line read,
// SIGTERM at the end.
class GatewayProcess {
 public:
  GatewayProcess(const std::vector<std::string>& argv, const std::string& log) {
    int out[2];
    if (pipe(out) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> cargv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, cargv[0], &fa, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    if (rc != 0) {
      pid_ = -1;
      close(out[0]);
      return;
    }
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    close(out[0]);
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      if (w.rfind("grpc=", 0) == 0) address_ = w.substr(5);
      if (w.rfind("http=", 0) == 0 && w != "http=off") http_address_ = w.substr(5);
    }
  }
  ~GatewayProcess() { Stop(); }
  // SIGTERM and reap; the exit code (or -1).
  int Stop() {
    if (pid_ <= 0) return exit_code_;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return exit_code_;
  }
  const std::string& address() const { return address_; }
  const std::string& http_address() const { return http_address_; }

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::string address_, http_address_;
};

v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int tokens) {
  v1::GenerateRequest r;
  for (int32_t id : prompt) r.mutable_token_ids()->add_ids(id);
  r.set_max_new_tokens(tokens);
  r.set_temperature(0);
  r.set_ignore_eos(true);
  return r;
}

Stream GatewayStream(v1::Generation::Stub& stub, const v1::GenerateRequest& req) {
  Stream st;
  grpc::ClientContext ctx;
  st.start = Clock::now();
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    // The text held back for stop strings comes with the final message.
    if (resp.has_final()) st.text += resp.final().text();
    if (!resp.has_chunk()) continue;
    const auto now = Clock::now();
    for (int32_t id : resp.chunk().token_ids()) {
      st.ids.push_back(id);
      st.arrivals.push_back(now);
    }
    st.text += resp.chunk().text();
  }
  const grpc::Status s = reader->Finish();
  if (!s.ok()) st.error = s.error_message();
  return st;
}

// The same request through the OpenAI HTTP API (POST /v1/completions, the prompt as token
// ids, server-sent events), read with cpp-httplib's client as the events arrive, on `client`:
// a kept-alive connection of its own per stream (HTTP/1.1 has one response in flight per
// connection; the OpenAI clients keep such a pool). One `data:` event per token (the gateway
// sends one per token that has text: a token whose bytes end mid-UTF-8 sends none, which the
// count at the end shows); TTFT = the first such event.
Stream HttpStream(httplib::Client& client, const std::vector<int32_t>& prompt, int tokens) {
  Stream st;
  const nlohmann::json body = {{"prompt", prompt}, {"max_tokens", tokens},
                               {"temperature", 0}, {"ignore_eos", true},
                               {"stream", true},   {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  std::string pending;  // bytes of an event not yet complete
  bool done = false;
  auto on_event = [&](std::string_view event) {
    if (event.rfind("data: ", 0) != 0) return;
    const std::string_view data = event.substr(6);
    if (data == "[DONE]") {
      done = true;
      return;
    }
    const auto j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      st.error = "an event that is not JSON: " + std::string(data);
      return;
    }
    if (j.contains("error")) {
      st.error = j["error"].dump();
      return;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      st.usage_tokens = j["usage"].value("completion_tokens", int64_t{-1});
    }
    const auto& choices = j["choices"];
    if (!choices.is_array() || choices.empty()) return;
    const auto& c = choices[0];
    if (c.contains("text") && c["text"].is_string()) st.text += c["text"].get<std::string>();
    if (c.contains("finish_reason") && c["finish_reason"].is_null()) {
      st.arrivals.push_back(Clock::now());
    }
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      on_event(std::string_view(pending).substr(0, end));
      pending.erase(0, end + 2);
    }
    return st.error.empty();
  };
  st.start = Clock::now();
  const httplib::Result res = client.send(req);
  if (!st.error.empty()) return st;
  if (!res) {
    st.error = "HTTP request failed: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    st.error = absl::StrCat("HTTP status ", res->status, ": ", pending);
  } else if (!done) {
    st.error = "the event stream ended without data: [DONE]";
  }
  return st;
}

// Local, batch of 1: Generate() over the engine, timed from the call to each token callback.
absl::StatusOr<Stream> LocalStream(driver::SplitEngine& engine, int32_t eos,
                                   const std::vector<int32_t>& prompt, int tokens) {
  Stream st;
  GenerationRequest req;
  req.prompt = prompt;
  req.max_new_tokens = tokens;
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  st.start = Clock::now();
  auto stats = Generate(engine, eos, req, [&](int32_t token, std::span<const float>) {
    st.ids.push_back(token);
    st.arrivals.push_back(Clock::now());
    return true;
  });
  if (!stats.ok()) return stats.status();
  return st;
}

// Local, batched: every prompt prefilled in one step, then one decode step per token with one
// entry per sequence; greedy argmax. All streams share each step's arrival time.
absl::StatusOr<std::vector<Stream>> LocalBatched(driver::SplitEngine& engine,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 int tokens) {
  const int n = static_cast<int>(prompts.size());
  const int64_t vocab = engine.vocab_size();
  std::vector<Stream> streams(n);
  std::vector<BatchEntry> batch;
  for (int s = 0; s < n; ++s) {
    engine.ResetSlot(s);
    for (size_t p = 0; p < prompts[s].size(); ++p) {
      batch.push_back({s, static_cast<int32_t>(p), prompts[s][p], p + 1 == prompts[s].size()});
    }
  }
  std::vector<float> logits;
  const auto start = Clock::now();
  for (Stream& st : streams) st.start = start;
  for (int t = 0; t < tokens; ++t) {
    if (absl::Status s = engine.Run(batch, logits); !s.ok()) return s;
    const auto now = Clock::now();
    batch.clear();
    for (int s = 0; s < n; ++s) {
      const float* row = logits.data() + static_cast<int64_t>(s) * vocab;
      const int32_t next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      streams[s].ids.push_back(next);
      streams[s].arrivals.push_back(now);
      batch.push_back({s, static_cast<int32_t>(prompts[s].size()) + t, next, true});
    }
  }
  return streams;
}

std::string HardwareLine() {
  std::string cpu = "unknown cpu";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return absl::StrCat(cpu, ", ", std::thread::hardware_concurrency(), " cpus online");
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

int Usage() {
  std::fprintf(stderr,
               "usage: gateway_bench [--model M.gguf] [--bindir DIR] [--tokens 64] [--rounds 6] "
               "[--streams 1,4,16] [--hot-fraction 0.5] [--no-http]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, bindir, hot = "0.5";
  int tokens = 64, rounds = 6;
  std::vector<int> concurrency = {1, 4, 16};
  bool http = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-http") {
      http = false;
      continue;
    }
    if (i + 1 >= argc) return Usage();
    const std::string v = argv[++i];
    bool ok = true;
    if (a == "--model") {
      model_path = v;
    } else if (a == "--bindir") {
      bindir = v;
    } else if (a == "--tokens") {
      ok = absl::SimpleAtoi(v, &tokens) && tokens >= 2;
    } else if (a == "--rounds") {
      ok = absl::SimpleAtoi(v, &rounds) && rounds >= 1;
    } else if (a == "--hot-fraction") {
      double h;
      ok = absl::SimpleAtod(v, &h) && h >= 0 && h <= 1;
      hot = v;
    } else if (a == "--streams") {
      concurrency.clear();
      for (auto part : absl::StrSplit(v, ',')) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(part, &n) && n >= 1 && n <= 64;
        concurrency.push_back(n);
      }
    } else {
      ok = false;
    }
    if (!ok) return Usage();
  }
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "gateway_bench: %s\n", what.c_str());
    return 1;
  };
  if (bindir.empty()) {
    auto self = driver::SelfBinDir();
    if (!self.ok()) return fail(std::string(self.status().message()));
    bindir = *self;
  }
  const int max_streams = *std::max_element(concurrency.begin(), concurrency.end());
  const std::string tmp = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                       "/gateway_bench-", getpid());
  std::filesystem::create_directories(tmp);
  const std::string log = tmp + "/log";
  std::printf("hardware: %s; load average at start: %s\n", HardwareLine().c_str(),
              LoadAverage().c_str());
  if (model_path.empty()) {
    model_path = tmp + "/synth.gguf";
    const auto t0 = Clock::now();
    if (RunProcess({bindir + "/thermocline", "synth", "-o", model_path, "--dim", "512", "--ffn",
                    "1376", "--layers", "8", "--heads", "8", "--kv-heads", "8", "--vocab", "4096",
                    "--context", "512", "--type", "f32", "--ffn-kind", "relu-gated", "--seed", "1"},
                   log) != 0) {
      return fail("thermocline synth failed; see " + log);
    }
    std::printf("model: synthesized %s in %.1f s (dim 512, ffn 1376 relu-gated, 8 layers, "
                "vocab 4096, f32)\n", model_path.c_str(), Seconds(t0, Clock::now()));
  }
  auto model = Model::Load(model_path);
  if (!model.ok()) return fail(std::string(model.status().message()));
  const ModelConfig& config = (*model)->config();
  const Tokenizer& tok = (*model)->tokenizer();
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : kPrompts) prompts.push_back(tok.Encode(p, /*add_bos=*/true));
  int32_t longest = 0;
  for (const auto& p : prompts) {
    longest = std::max<int32_t>(longest, static_cast<int32_t>(p.size()));
  }
  const int32_t context = std::min<int32_t>(static_cast<int32_t>(config.context_length),
                                            longest + tokens + 1);
  std::printf("model %s: %lld layers, dim %lld, ffn %lld, vocab %lld; hot fraction %s; "
              "%d tokens per stream (greedy, ignore_eos), prompts %zu..%d tokens, %d rounds\n",
              model_path.c_str(), static_cast<long long>(config.n_layers),
              static_cast<long long>(config.dim), static_cast<long long>(config.ffn_dim),
              static_cast<long long>(config.vocab_size), hot.c_str(), tokens,
              std::min_element(prompts.begin(), prompts.end(),
                               [](auto& a, auto& b) { return a.size() < b.size(); })->size(),
              longest, rounds);
  std::printf("both sides: gpu worker 1 thread + cpu worker 1 thread; gateway --max-batch %d "
              "--kv-slots %d\n\n", std::max(16, max_streams), std::max(16, max_streams));

  // The local driver: a SplitEngine with the gateway's options, slots for the largest batch.
  // It and the gateway both exist for the whole run, but only one side runs at a time: idle
  // workers sleep on their rings' futexes, so the side not being measured costs nothing, and
  // alternating rounds lets both sides see the same machine state (other builds come and go).
  driver::SplitEngineOptions o;
  o.model_path = model_path;
  o.config = config;
  o.hot_fraction = std::stod(hot);
  o.kv_slots = max_streams;
  o.context = context;
  o.bindir = bindir;
  o.log_path = log;
  auto engine = driver::SplitEngine::Create(o);
  if (!engine.ok()) return fail(std::string(engine.status().message()));
  // Warm-up: the first steps fault in the workers' pages.
  if (auto w = LocalStream(**engine, tok.eos(), prompts[0], 4); !w.ok()) {
    return fail(std::string(w.status().message()));
  }

  const std::string slots = std::to_string(std::max(16, max_streams));
  std::vector<std::string> gateway_argv = {
      bindir + "/thermocline-gateway", "--model", model_path, "--hot-fraction", hot, "--listen",
      "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--instance",
      absl::StrCat("gwbench-", getpid()), "--max-batch", slots, "--kv-slots", slots, "--context",
      std::to_string(context)};
  if (http) {
    gateway_argv.push_back("--http-listen");
    gateway_argv.push_back("127.0.0.1:0");
  }
  GatewayProcess gateway(gateway_argv, tmp + "/gateway.log");
  if (gateway.address().empty() || (http && gateway.http_address().empty())) {
    return fail("the gateway did not start; see " + tmp + "/gateway.log");
  }
  // One kept-alive HTTP connection per stream slot, counted each time one is opened: the
  // gateway's cpp-httplib closes a connection after 5 requests (CPPHTTPLIB_KEEPALIVE_MAX_COUNT)
  // and listens with a backlog of 5, so a round that reopens many at once can lose SYNs to a
  // 1 s retransmit; the count says whether that happened during the rounds.
  std::vector<std::unique_ptr<httplib::Client>> http_clients;
  std::atomic<int> http_connects{0};
  if (http) {
    const size_t colon = gateway.http_address().rfind(':');
    int port = 0;
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(gateway.http_address().substr(colon + 1), &port)) {
      return fail("the gateway's http address is not HOST:PORT: " + gateway.http_address());
    }
    for (int i = 0; i < max_streams; ++i) {
      auto& c = http_clients.emplace_back(
          std::make_unique<httplib::Client>(gateway.http_address().substr(0, colon), port));
      c->set_keep_alive(true);
      c->set_tcp_nodelay(true);
      c->set_read_timeout(std::chrono::seconds(120));
      c->set_socket_options([&](socket_t) { ++http_connects; });
    }
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  auto channel =
      grpc::CreateCustomChannel(gateway.address(), grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Generation::NewStub(channel);
  // Until the model is loaded Generate answers UNAVAILABLE ("loading"); the first success is
  // also the warm-up.
  for (int i = 0;; ++i) {
    Stream w = GatewayStream(*stub, Request(prompts[0], 4));
    if (w.error.empty()) break;
    if (i == 600) return fail("the gateway never served: " + w.error);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // The HTTP warm-up opens the connections one after another (not in a burst: see above).
  for (auto& c : http_clients) {
    if (Stream w = HttpStream(*c, prompts[0], 4); !w.error.empty()) {
      return fail("the HTTP API failed its warm-up: " + w.error);
    }
  }
  http_connects = 0;

  std::printf("%-14s %7s %9s %9s %9s %9s %10s %10s\n", "side", "streams", "TTFT p50",
              "TTFT p99", "ITL p50", "ITL p99", "decode", "aggregate");
  std::printf("%-14s %7s %9s %9s %9s %9s %10s %10s\n", "", "", "ms", "ms", "ms", "ms",
              "tok/s/str", "tok/s");
  // Per round (gateway / local): decode tokens/s per stream at 1 stream, aggregate at the
  // largest concurrency; for each API.
  std::vector<double> grpc_one, grpc_max, http_one, http_max;
  // Per round, HTTP / gRPC at each concurrency.
  struct HttpRatios {
    int streams;
    std::vector<double> aggregate, ttft, itl;
  };
  std::vector<HttpRatios> http_ratios;
  bool same_one = true, same_max = true, same_text = true;
  int64_t http_events = 0, http_usage_tokens = 0;
  for (int n : concurrency) {
    Summary grpc_total, http_total, local_total;
    HttpRatios hr{n, {}, {}, {}};
    const bool compare_one = n == 1, compare_batched = n == max_streams && n > 1;
    for (int r = 0; r < rounds; ++r) {
      // N=1 uses prompt r (so the rounds differ); otherwise stream i uses prompt i.
      std::vector<std::vector<int32_t>> round_prompts;
      for (int i = 0; i < n; ++i) round_prompts.push_back(prompts[(n == 1 ? r : i) % kNumPrompts]);
      std::vector<Stream> grpc_streams(n), http_streams(n), local_streams;
      // N streams started together, one thread each.
      auto run_concurrent = [&](std::vector<Stream>& out,
                                const std::function<Stream(int)>& one) -> absl::Status {
        std::vector<std::thread> threads;
        for (int i = 0; i < n; ++i) {
          threads.emplace_back([&, i] { out[i] = one(i); });
        }
        for (auto& t : threads) t.join();
        for (const Stream& st : out) {
          if (!st.error.empty()) return absl::InternalError("a stream failed: " + st.error);
        }
        return absl::OkStatus();
      };
      auto run_grpc = [&] {
        return run_concurrent(grpc_streams, [&](int i) {
          return GatewayStream(*stub, Request(round_prompts[i], tokens));
        });
      };
      auto run_http = [&] {
        return run_concurrent(http_streams, [&](int i) {
          return HttpStream(*http_clients[i], round_prompts[i], tokens);
        });
      };
      auto run_local = [&]() -> absl::Status {
        if (compare_one) {
          auto st = LocalStream(**engine, tok.eos(), round_prompts[0], tokens);
          if (!st.ok()) return st.status();
          local_streams.push_back(*std::move(st));
        } else if (compare_batched) {
          auto sts = LocalBatched(**engine, round_prompts, tokens);
          if (!sts.ok()) return sts.status();
          local_streams = *std::move(sts);
        }
        return absl::OkStatus();
      };
      // Which side goes first rotates too, so none always runs right after another (a warm
      // cache, or a burst of someone else's build, would otherwise favour one side).
      std::vector<std::function<absl::Status()>> sides = {run_grpc, run_local};
      if (http) sides.push_back(run_http);
      std::rotate(sides.begin(), sides.begin() + r % static_cast<int>(sides.size()), sides.end());
      for (const auto& side : sides) {
        if (absl::Status s = side(); !s.ok()) return fail(std::string(s.message()));
      }

      const Summary g = RoundSummary(grpc_streams);
      Merge(grpc_total, g, rounds);
      Summary h;
      if (http) {
        h = RoundSummary(http_streams);
        Merge(http_total, h, rounds);
        hr.aggregate.push_back(Aggregate(h) / Aggregate(g));
        hr.ttft.push_back(Percentile(h.ttft, 50) / Percentile(g.ttft, 50));
        hr.itl.push_back(Percentile(h.itl, 50) / Percentile(g.itl, 50));
        for (int i = 0; i < n; ++i) {
          same_text = same_text && http_streams[i].text == grpc_streams[i].text;
          http_events += static_cast<int64_t>(http_streams[i].arrivals.size());
          http_usage_tokens += http_streams[i].usage_tokens;
        }
      }
      if (local_streams.empty()) continue;
      const Summary l = RoundSummary(local_streams);
      Merge(local_total, l, rounds);
      for (size_t i = 0; i < local_streams.size(); ++i) {
        bool& same = compare_one ? same_one : same_max;
        same = same && local_streams[i].ids == grpc_streams[i].ids;
      }
      if (compare_one) {
        grpc_one.push_back(g.decode_tps / l.decode_tps);
        if (http) http_one.push_back(h.decode_tps / l.decode_tps);
      }
      if (compare_batched) {
        grpc_max.push_back(Aggregate(g) / Aggregate(l));
        if (http) http_max.push_back(Aggregate(h) / Aggregate(l));
      }
    }
    PrintRow("gateway grpc", n, grpc_total);
    if (http) PrintRow("gateway http", n, http_total);
    if (compare_one) PrintRow("local", n, local_total);
    if (compare_batched) PrintRow("local batched", n, local_total);
    if (http) http_ratios.push_back(std::move(hr));
  }
  const int stopped = gateway.Stop();

  auto range = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("n/a");
    return absl::StrFormat("median %.3f (rounds %.3f..%.3f)", Percentile(v, 50),
                           *std::min_element(v.begin(), v.end()),
                           *std::max_element(v.begin(), v.end()));
  };
  std::printf("\ngateway overhead, gateway / local driver (1.0 = none; rounds alternate sides):\n");
  // The HTTP API's ratio next to gRPC's on the same line ("" without it).
  auto and_http = [&](const std::vector<double>& v) {
    return http ? absl::StrCat("; http ", range(v)) : std::string();
  };
  std::printf("  1 stream, decode tokens/s per stream: grpc %s%s\n", range(grpc_one).c_str(),
              and_http(http_one).c_str());
  std::printf("  %d streams, aggregate tokens/s (local batched): grpc %s%s\n", max_streams,
              range(grpc_max).c_str(), and_http(http_max).c_str());
  if (http) {
    std::printf(
        "\nHTTP / gRPC, per round (aggregate tokens/s: above 1.0 = HTTP faster; TTFT and "
        "ITL p50: above 1.0 = HTTP slower):\n");
    for (const HttpRatios& hr : http_ratios) {
      std::printf("  %2d streams: aggregate %s; TTFT p50 %s; ITL p50 %s\n", hr.streams,
                  range(hr.aggregate).c_str(), range(hr.ttft).c_str(), range(hr.itl).c_str());
    }
  }
  std::printf("\nsame greedy tokens as the local driver (gRPC): 1 stream %s, %d streams %s",
              same_one ? "yes" : "NO", max_streams, same_max ? "yes" : "NO");
  if (http) {
    std::printf(
        "; HTTP text equal to gRPC's: %s; HTTP data events %lld for %lld tokens (usage "
        "completion_tokens; a token with no text of its own sends none); HTTP connections "
        "opened during the rounds: %d",
        same_text ? "yes" : "NO", static_cast<long long>(http_events),
        static_cast<long long>(http_usage_tokens), http_connects.load());
  }
  std::printf("\ngateway exit code on SIGTERM: %d; load average at end: %s\n", stopped,
              LoadAverage().c_str());
  std::filesystem::remove_all(tmp);
  return 0;
}
