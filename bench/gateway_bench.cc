// Time to first token (TTFT) and inter-token latency (ITL), p50 and p99, at 1, 4 and 16
// concurrent gRPC streams through a real thermocline-gateway (spawn mode: it starts and drives
// the two workers), measured client-side; and, in the same run, the same requests through the
// local driver (shared/driver's SplitEngine in this process, no gRPC, no scheduler), so the
// gateway's overhead is a ratio of two numbers taken on the same machine in alternating
// rounds rather than an absolute figure (the machines we share are loaded by other builds; raw
// tokens/s here mean little).
//
//   - gateway: for each concurrency N, --rounds rounds of N streams started together, each a
//     fixed prompt (token ids, so both sides see identical prompts) and --tokens greedy tokens
//     with ignore_eos (a random model emits </s> whenever it likes). TTFT = first chunk -
//     call start; ITL = the gaps between a stream's consecutive chunks (one chunk per token);
//     aggregate tokens/s = all tokens / (last chunk - first call start) of the round.
//   - local driver, alternating round by round with the gateway's (split_bench's method: both
//     sides see the same machine state): at N=1 the same request through Generate() over a
//     SplitEngine with the gateway's worker threads and hot fraction (batch of 1); at the
//     largest N the same N prompts as one batch per step over SplitEngine::Run (prefill all,
//     then one N-entry decode step per token, greedy argmax): what the gateway's streams could
//     reach with no gRPC, sampling, text streaming or scheduling.
//   - overhead: per round, gateway / local decode tokens/s at 1 stream and gateway / local
//     aggregate tokens/s at the largest N; the median and range over the rounds (1.0 = none).
//
// Default model: synthesized into a temporary directory with `thermocline synth` (dim 512,
// ffn 1376 relu-gated, 8 layers, 8 heads, vocab 4096, context 512, f32: 29.5 M parameters,
// 118 MB: large enough that a step is real work, not just ring hops; 5-10 ms/token split on two
// shared cores, so a full run takes about a minute). --model uses an existing file instead.
//
// Usage: gateway_bench [--model M.gguf] [--bindir DIR] [--tokens 64] [--rounds 6]
//                      [--streams 1,4,16] [--hot-fraction 0.5]
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
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

void PrintRow(const std::string& side, int streams, const Summary& s) {
  std::printf("%-14s %7d %9.1f %9.1f %9.2f %9.2f %10.1f %10.1f\n", side.c_str(), streams,
              1e3 * Percentile(s.ttft, 50), 1e3 * Percentile(s.ttft, 99),
              1e3 * Percentile(s.itl, 50), 1e3 * Percentile(s.itl, 99), s.decode_tps,
              s.wall > 0 ? static_cast<double>(s.tokens) / s.wall : 0);
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

// The gateway process: started on free ports, its "listening grpc=..." line read, SIGTERM at
// the end.
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

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::string address_;
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
    if (!resp.has_chunk()) continue;
    const auto now = Clock::now();
    for (int32_t id : resp.chunk().token_ids()) {
      st.ids.push_back(id);
      st.arrivals.push_back(now);
    }
  }
  const grpc::Status s = reader->Finish();
  if (!s.ok()) st.error = s.error_message();
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
               "[--streams 1,4,16] [--hot-fraction 0.5]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, bindir, hot = "0.5";
  int tokens = 64, rounds = 6;
  std::vector<int> concurrency = {1, 4, 16};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
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
  GatewayProcess gateway({bindir + "/thermocline-gateway", "--model", model_path,
                          "--hot-fraction", hot, "--listen", "127.0.0.1:0", "--metrics-listen",
                          "127.0.0.1:0", "--instance", absl::StrCat("gwbench-", getpid()),
                          "--max-batch", slots, "--kv-slots", slots, "--context",
                          std::to_string(context)},
                         tmp + "/gateway.log");
  if (gateway.address().empty()) {
    return fail("the gateway did not start; see " + tmp + "/gateway.log");
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

  std::printf("%-14s %7s %9s %9s %9s %9s %10s %10s\n", "side", "streams", "TTFT p50",
              "TTFT p99", "ITL p50", "ITL p99", "decode", "aggregate");
  std::printf("%-14s %7s %9s %9s %9s %9s %10s %10s\n", "", "", "ms", "ms", "ms", "ms",
              "tok/s/str", "tok/s");
  // Per round (gateway / local): decode tokens/s per stream at 1 stream, aggregate at the
  // largest concurrency.
  std::vector<double> ratio_one, ratio_max;
  bool same_one = true, same_max = true;
  for (int n : concurrency) {
    Summary gw, local;
    const bool compare_one = n == 1, compare_batched = n == max_streams && n > 1;
    for (int r = 0; r < rounds; ++r) {
      // N=1 uses prompt r (so the rounds differ); otherwise stream i uses prompt i.
      std::vector<std::vector<int32_t>> round_prompts;
      for (int i = 0; i < n; ++i) round_prompts.push_back(prompts[(n == 1 ? r : i) % kNumPrompts]);
      std::vector<Stream> streams(n), local_streams;
      auto run_gateway = [&]() -> absl::Status {
        std::vector<std::thread> threads;
        for (int i = 0; i < n; ++i) {
          threads.emplace_back([&, i] {
            streams[i] = GatewayStream(*stub, Request(round_prompts[i], tokens));
          });
        }
        for (auto& t : threads) t.join();
        for (const Stream& st : streams) {
          if (!st.error.empty()) return absl::InternalError("a stream failed: " + st.error);
        }
        return absl::OkStatus();
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
      // Which side goes first alternates too, so neither always runs right after the other
      // (a warm cache, or a burst of someone else's build, would otherwise favour one side).
      absl::Status s1 = r % 2 == 0 ? run_gateway() : run_local();
      absl::Status s2 = s1.ok() ? (r % 2 == 0 ? run_local() : run_gateway()) : s1;
      if (!s2.ok()) return fail(std::string(s2.message()));

      Clock::time_point first = streams[0].start, last = streams[0].start;
      for (const Stream& st : streams) {
        first = std::min(first, st.start);
        last = std::max(last, st.arrivals.back());
        Add(gw, st);
      }
      const double gw_wall = Seconds(first, last);
      gw.wall += gw_wall;
      const double gw_tps = DecodeTps(streams);
      gw.decode_tps += gw_tps / rounds;
      if (local_streams.empty()) continue;
      for (size_t i = 0; i < local_streams.size(); ++i) {
        Add(local, local_streams[i]);
        bool& same = compare_one ? same_one : same_max;
        same = same && local_streams[i].ids == streams[i].ids;
      }
      const double local_wall = Seconds(local_streams[0].start, local_streams[0].arrivals.back());
      local.wall += local_wall;
      const double local_tps = DecodeTps(local_streams);
      local.decode_tps += local_tps / rounds;
      if (compare_one) ratio_one.push_back(gw_tps / local_tps);
      if (compare_batched) ratio_max.push_back(local_wall / gw_wall);  // same token count
    }
    PrintRow("gateway", n, gw);
    if (compare_one) PrintRow("local", n, local);
    if (compare_batched) PrintRow("local batched", n, local);
  }
  const int stopped = gateway.Stop();

  auto range = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("n/a");
    return absl::StrFormat("median %.3f (rounds %.3f..%.3f)", Percentile(v, 50),
                           *std::min_element(v.begin(), v.end()),
                           *std::max_element(v.begin(), v.end()));
  };
  std::printf("\ngateway overhead, gateway / local driver (1.0 = none; rounds alternate sides):\n");
  std::printf("  1 stream, decode tokens/s per stream: %s\n", range(ratio_one).c_str());
  std::printf("  %d streams, aggregate tokens/s (local batched): %s\n", max_streams,
              range(ratio_max).c_str());
  std::printf("same greedy tokens as the local driver: 1 stream %s, %d streams %s; gateway "
              "exit code on SIGTERM: %d; load average at end: %s\n",
              same_one ? "yes" : "NO", max_streams, same_max ? "yes" : "NO", stopped,
              LoadAverage().c_str());
  std::filesystem::remove_all(tmp);
  return 0;
}
