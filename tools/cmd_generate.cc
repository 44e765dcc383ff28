// `thermocline generate`: generation on this machine, in this process, or with --split in the
// two worker processes (thermocline-gpu-worker and thermocline-cpu-worker, started and
// supervised by the driver library in shared/driver/; see docs/split.md). Both paths run the
// same Generate loop, so they print the same text for the same flags. With --server ADDR the
// generation runs in a thermocline-gateway instead (tools/grpc_client.h), with the same
// sampling flags sent explicitly, so a greedy run prints what the local one prints.
// --grammar FILE / --json-schema FILE constrain the output (docs/gateway.md#structured-output):
// locally through a TokenConstraint over shared/grammar, with --server as the request's fields.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "shared/driver/default_placement.h"
#include "shared/driver/gpu_backend_flags.h"
#include "shared/driver/split_engine.h"
#include "shared/grammar/gbnf.h"
#include "shared/grammar/json_schema.h"
#include "shared/grammar/matcher.h"
#include "shared/grammar/token_mask.h"
#include "shared/model/model.h"
#include "shared/runtime/generate.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/sparsity_options.h"
#include "shared/sparsity/sparsity_setup.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_options.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/util/cpu_features.h"
#include "tools/command.h"
#include "tools/generation_flags.h"
#include "tools/grpc_client.h"

namespace thermocline::tools {
namespace {

int Fail(const std::string& msg) {
  std::cerr << "thermocline generate: " << msg << "\n";
  return 1;
}

// Set by SIGINT/SIGTERM during a split generation.
std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) { g_interrupted.store(true); }

// Prints the prompt, then each token's text as it comes; the local and the split path print
// through this alike. Stops after the current token once `*stop` is set.
absl::StatusOr<GenerationStats> GenerateAndPrint(BatchRunner& runner, const Tokenizer& tok,
                                                 const std::string& prompt,
                                                 const GenerationRequest& req,
                                                 const std::atomic<bool>* stop = nullptr) {
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  StreamingDetokenizer detok(tok);
  auto stats = Generate(runner, tok.eos(), req, [&](int32_t token, std::span<const float>) {
    const std::string text = detok.Push(token);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return stop == nullptr || !stop->load();
  });
  const std::string rest = detok.Flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  return stats;
}

int RunSplit(const Model& model, const GenerationRequest& req, const std::string& prompt,
             int64_t capacity, const std::string& kv_type, const SparsityFlags& sf,
             const TealFlags& tf, int64_t vram_budget_bytes, driver::SplitEngineOptions so) {
  driver::DefaultPlacement placed;
  absl::Cleanup remove_plan = [&placed] { driver::RemoveDefaultPlan(placed); };
  if (so.plan_path.empty() && !so.hot_fraction.has_value()) {
    driver::DefaultPlacementOptions dp;
    dp.gpu_backend = so.gpu_backend;
    dp.model_path = model.file().path();
    dp.stats_path = sf.stats_path;
    dp.predictor_path = sf.predictor_path;
    dp.vram_budget = vram_budget_bytes;
    dp.context = capacity;
    dp.kv_slots = 1;
    dp.kv_type = kv_type;
    dp.bindir = so.bindir;
    absl::StatusOr<driver::DefaultPlacement> chosen = driver::ChooseDefaultPlacement(dp);
    if (!chosen.ok()) return Fail(std::string(chosen.status().message()));
    placed = std::move(*chosen);
    if (placed.hot_fraction.has_value()) {
      so.hot_fraction = placed.hot_fraction;
      std::cerr << "thermocline generate: no --hot-fraction or --plan; placing the whole FFN on "
                   "the gpu worker (hot fraction 1: "
                << placed.why << ")\n";
    } else {
      so.plan_path = placed.plan_path;
      std::cerr << absl::StrFormat(
          "thermocline generate: no --hot-fraction or --plan; %.1f%% of the FFN's bytes on the "
          "device: %s\n",
          100 * placed.gpu_ffn_share, placed.why);
    }
  }
  so.model_path = model.file().path();
  so.config = model.config();
  so.sparsity = sf;
  so.teal = tf;
  so.kv_slots = 1;
  so.context = static_cast<int32_t>(capacity);
  so.kv_type = kv_type;
  so.max_batch = std::max(1, req.prefill_chunk);
  auto engine = driver::SplitEngine::Create(std::move(so));
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  // Ctrl-C or SIGTERM ends the generation after the current step, so that the engine's
  // destructor stops the workers and removes the segment (the default action would kill the
  // driver and leave a stale segment behind). The workers are in their own process group and
  // do not see a terminal's Ctrl-C.
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto stats = GenerateAndPrint(**engine, model.tokenizer(), prompt, req, &g_interrupted);
  if (!stats.ok()) return Fail(std::string(stats.status().message()));
  if (g_interrupted.load()) {
    std::cerr << "thermocline generate: interrupted; workers stopped\n";
    return 130;
  }
  const driver::SplitEngineStats& es = (*engine)->stats();
  std::cerr << absl::StrFormat(
      "prompt: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens, %.1f tok/s; split over "
      "instance %s (gpu worker %d threads, cpu worker %d threads); %d steps, %d worker "
      "restarts, %d tokens replayed\n",
      stats->prompt_tokens, stats->prefill_seconds,
      stats->prompt_tokens / std::max(1e-9, stats->prefill_seconds), stats->generated_tokens,
      stats->decode_steps / std::max(1e-9, stats->decode_seconds), (*engine)->instance(),
      (*engine)->options().gpu_threads, (*engine)->options().cpu_threads, es.steps, es.restarts,
      es.replayed_tokens);
  return 0;
}

// Options of the local paths that a gateway decides for itself (its own flags).
constexpr const char* kLocalOnly[] = {"model",       "threads",  "context", "kv-type",
                                      "split",       "hot-fraction", "plan", "backend",
                                      "vram-budget", "gpu-threads", "cpu-threads", "instance",
                                      "cpus",        "numa-node", "mlock", "bindir",
                                      "worker-log"};

// --server: one streaming Generate call; text to stdout as it arrives (after the prompt, as
// the local paths print it), the final stats to stderr.
// The grammar's mask for local generation, as the gateway's scheduler applies it: EOS only
// where the text is whole, the end once nothing can follow.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const grammar::Grammar> g, const Tokenizer& tok,
                    bool ignore_eos)
      : matcher_(g), tok_(tok), trie_(tok), masks_(g) {
    if (!ignore_eos) ends_.push_back(tok.eos());
  }
  absl::StatusOr<std::span<const uint8_t>> Allowed() override {
    if (masks_.Compute(matcher_.state(), trie_, &mask_, ends_) == 0) {
      return absl::FailedPreconditionError(
          "no token of the vocabulary continues the grammar: it needs text this model cannot "
          "write");
    }
    return std::span<const uint8_t>(mask_);
  }
  bool Taken(int32_t token) override {
    return matcher_.Accept(tok_.TokenBytes(-1, token)) && matcher_.IsComplete();
  }

 private:
  grammar::Matcher matcher_;
  const Tokenizer& tok_;
  grammar::VocabTrie trie_;
  grammar::MaskComputer masks_;
  std::vector<uint8_t> mask_;
  std::vector<int32_t> ends_;
};

// --grammar FILE / --json-schema FILE: the file's text, and (locally) the compiled grammar.
struct StructuredOutput {
  std::string grammar, json_schema;  // file contents, as the request's fields
  std::shared_ptr<const grammar::Grammar> compiled;
};
absl::StatusOr<StructuredOutput> ReadStructuredOutput(const std::string& grammar_path,
                                                      const std::string& schema_path) {
  StructuredOutput out;
  if (grammar_path.empty() && schema_path.empty()) return out;
  if (!grammar_path.empty() && !schema_path.empty()) {
    return absl::InvalidArgumentError("give --grammar or --json-schema, not both");
  }
  const std::string& path = grammar_path.empty() ? schema_path : grammar_path;
  const char* flag = grammar_path.empty() ? "--json-schema" : "--grammar";
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read it"));
  std::stringstream text;
  text << f.rdbuf();
  std::string gbnf = text.str();
  if (grammar_path.empty()) {
    out.json_schema = gbnf;
    absl::StatusOr<std::string> compiled = grammar::JsonSchemaToGbnf(gbnf);
    if (!compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", path, ": ", compiled.status().message()));
    }
    gbnf = *std::move(compiled);
  } else {
    out.grammar = gbnf;
  }
  absl::StatusOr<grammar::Grammar> parsed = grammar::ParseGbnf(gbnf);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", parsed.status().message()));
  }
  out.compiled = std::make_shared<const grammar::Grammar>(*std::move(parsed));
  return out;
}

int RunServer(const std::string& address, const std::string& prompt, int32_t max_new_tokens,
              const SamplingParams& sp, bool ignore_eos, const std::vector<std::string>& stops,
              std::optional<int32_t> logprobs, const std::string& request_id,
              double wait_ready_seconds, const ClientSecurity& security, bool seed_given,
              const StructuredOutput& structured) {
  v1::GenerateRequest req;
  req.set_grammar(structured.grammar);
  req.set_json_schema(structured.json_schema);
  req.set_text(prompt);
  req.set_max_new_tokens(max_new_tokens);
  SetSamplingFields(sp, seed_given, req);
  for (const std::string& stop : stops) req.add_stop(stop);
  req.set_ignore_eos(ignore_eos);
  if (logprobs.has_value()) {
    req.set_logprobs(true);
    req.set_top_logprobs(*logprobs);
  }
  req.set_request_id(request_id);

  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // The prompt is printed with the first chunk (or the final message), so that a call the
  // server refuses, or one retried while it starts, prints nothing on stdout.
  bool printed_prompt = false;
  auto print_prompt = [&] {
    if (printed_prompt) return;
    printed_prompt = true;
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  };
  const absl::Time give_up = absl::Now() + absl::Seconds(wait_ready_seconds);
  absl::StatusOr<v1::Final> final;
  while (true) {
    final = StreamGenerate(
        address, req,
        [&](const v1::TokenChunk& chunk) {
          print_prompt();
          std::fwrite(chunk.text().data(), 1, chunk.text().size(), stdout);
          std::fflush(stdout);
          for (const v1::TokenLogprob& lp : chunk.logprobs()) {
            std::string line =
                absl::StrFormat("logprob: token %d %.4f", lp.token_id(), lp.logprob());
            for (const v1::TopLogprob& t : lp.top()) {
              absl::StrAppendFormat(&line, " | %d \"%s\" %.4f", t.token_id(),
                                    absl::CHexEscape(t.text()), t.logprob());
            }
            std::cerr << line << "\n";
          }
        },
        &g_interrupted, security);
    // UNAVAILABLE before any text: the gateway is starting (or restarting its workers), or not
    // up yet. --wait-ready retries that for a while; nothing was generated, so nothing repeats.
    if (final.ok() || printed_prompt || !absl::IsUnavailable(final.status()) ||
        g_interrupted.load() || absl::Now() >= give_up) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (!final.ok()) {
    if (printed_prompt) {
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
    if (g_interrupted.load()) {
      std::cerr << "thermocline generate: interrupted; request cancelled\n";
      return 130;
    }
    return Fail(std::string(final.status().message()));
  }
  print_prompt();
  std::fwrite(final->text().data(), 1, final->text().size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const v1::Timings& t = final->timings();
  std::string stats = absl::StrFormat(
      "finish: %s", FinishReasonName(final->finish_reason()));
  if (!final->matched_stop().empty()) {
    absl::StrAppendFormat(&stats, " (stop \"%s\")", absl::CHexEscape(final->matched_stop()));
  } else if (final->finish_reason() == v1::FINISH_REASON_EOS && final->matched_stop_token() >= 0) {
    absl::StrAppendFormat(&stats, " (token %d)", final->matched_stop_token());
  }
  absl::StrAppendFormat(&stats,
                        "; usage: %d prompt + %d completion tokens; queue %.3f s, first token "
                        "%.3f s, decode %.1f tok/s, total %.3f s; seed %d; request %s\n",
                        final->usage().prompt_tokens(), final->usage().completion_tokens(),
                        t.queue_seconds(), t.time_to_first_token_seconds(),
                        t.decode_tokens_per_second(), t.total_seconds(), final->seed(),
                        final->request_id());
  std::cerr << stats;
  return 0;
}

int RunGenerate(const std::vector<std::string>& args) {
  std::string model_path, prompt, kv_type;
  int32_t max_new_tokens = 0, threads = 0, context = 0;
  SamplingParams sp;
  bool ignore_eos = false;
  SparsityFlags sf;
  TealFlags tf;
  bool split = false;
  driver::SplitEngineOptions so;
  double hot_fraction = 0;
  int numa_node = -1;
  std::string backend, vram_budget;
  int64_t vram_budget_bytes = 0;  // 0: the device's free memory
  std::string grammar_path, schema_path;
  po::options_description opts("options");
  opts.add_options()
      ("model,m", po::value(&model_path), "model file (GGUF); required unless --server")
      ("prompt,p", po::value(&prompt)->default_value(""), "prompt text (BOS first when the vocabulary says so)")
      ("max-new-tokens,n", po::value(&max_new_tokens)->default_value(128), "tokens to generate at most");
  AddSamplingOptions(opts, sp);
  opts.add_options()
      ("threads", po::value(&threads)->default_value(0), "CPU threads (0 = all cores)")
      ("context", po::value(&context)->default_value(0), "KV cache positions (0 = prompt + max-new-tokens)")
      ("kv-type", po::value(&kv_type)->default_value("f32"), "KV cache element type: f32 or f16")
      ("check-tensors", po::value(&so.check_tensors)->default_value("auto"), "scan the weights for NaN/infinity at load: auto (files up to 2 GiB), on or off")
      ("ignore-eos", po::bool_switch(&ignore_eos), "keep generating past the end-of-sequence token")
      ("grammar", po::value(&grammar_path), "constrain the output to this GBNF grammar (docs/gateway.md#structured-output); generation ends when it is complete")
      ("json-schema", po::value(&schema_path), "or: to JSON holding what this JSON Schema file says");
  AddSparsityOptions(opts, sf);
  AddTealOptions(opts, tf);
  po::options_description split_opts("split execution (docs/split.md)");
  split_opts.add_options()
      ("split", po::bool_switch(&split), "run the model in a gpu worker and a cpu worker process")
      ("hot-fraction", po::value(&hot_fraction), "share of each layer's FFN neurons on the gpu worker, in [0, 1]")
      ("plan", po::value(&so.plan_path), "or: placement from `thermocline plan`")
      ("backend", po::value(&backend)->default_value("host"), "the gpu worker's compute backend: host (this machine's CPU) or cuda (one CUDA device, docs/cuda.md; without --plan or --hot-fraction, planned for --vram-budget or the device's free memory)")
      ("vram-budget", po::value(&vram_budget), "with --backend cuda: device memory the gpu worker may use, e.g. 20G or 1.5GiB (0: the device's free memory, the default)")
      ("gpu-threads", po::value(&so.gpu_threads)->default_value(1), "threads of the gpu worker")
      ("cpu-threads", po::value(&so.cpu_threads)->default_value(1), "threads of the cpu worker")
      ("instance", po::value(&so.instance), "transport instance name (default gen-<pid>-0)")
      ("cpus", po::value(&so.cpus), "CPUs the cpu worker runs on, e.g. 0-7")
      ("numa-node", po::value(&numa_node), "NUMA node of the cpu worker's threads and memory")
      ("mlock", po::bool_switch(&so.mlock), "lock the cpu worker's cold rows (and TEAL's copies of them) in memory")
      ("bindir", po::value(&so.bindir), "directory of the worker executables (default: this one's)")
      ("worker-log", po::value(&so.log_path), "append the workers' output here (default: stderr)");
  opts.add(split_opts);
  std::string server, request_id;
  ClientSecurityFlags sec;
  std::vector<std::string> stops;
  int32_t logprobs = 0;
  double wait_ready_seconds = 0;
  po::options_description server_opts("through a gateway (thermocline-gateway)");
  server_opts.add_options()
      ("server", po::value(&server), "generate on the gateway at HOST:PORT (gRPC), streaming the text")
      ("stop", po::value(&stops)->composing(), "stop string (repeatable); the text ends before it")
      ("logprobs", po::value(&logprobs), "print each token's log-probability and the N most likely alternatives to stderr")
      ("request-id", po::value(&request_id), "request id for the gateway's logs (default: one it makes)")
      ("wait-ready", po::value(&wait_ready_seconds), "retry up to this many seconds while the gateway answers UNAVAILABLE (starting)");
  AddClientSecurityOptions(server_opts, sec);
  opts.add(server_opts);
  po::positional_options_description pos;
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("generate", "--model M.gguf --prompt TEXT [options]", opts, pos, args, vm,
                    exit_code)) {
    return exit_code;
  }
  auto fail = Fail;
  absl::StatusOr<StructuredOutput> structured = ReadStructuredOutput(grammar_path, schema_path);
  if (!structured.ok()) return fail(std::string(structured.status().message()));
  if (!vm.count("server")) {
    for (const char* flag : {"stop", "logprobs", "request-id", "wait-ready", "tls-ca", "tls-cert",
                             "tls-key", "auth-token-file"}) {
      if (vm.count(flag)) return fail(std::string("--") + flag + " needs --server");
    }
    if (model_path.empty()) return fail("--model is required (or --server ADDR)");
  } else {
    for (const char* flag : kLocalOnly) {
      if (vm.count(flag) && !vm[flag].defaulted()) {
        return fail(std::string("--") + flag + " is for local generation; the gateway has its own");
      }
    }
    if (sp.penalty_window != 64) return fail("--penalty-window is fixed at 64 by the gateway");
    if (max_new_tokens < 1) return fail("--max-new-tokens must be >= 1 with --server");
    if (logprobs < 0) return fail("--logprobs must be >= 0");
    if (!(wait_ready_seconds >= 0 && wait_ready_seconds <= 3600)) {
      return fail("--wait-ready must be in [0, 3600] seconds");
    }
    if (absl::Status s = ValidateSamplingParams(sp); !s.ok()) return fail(std::string(s.message()));
    absl::StatusOr<ClientSecurity> security =
        LoadClientSecurity(sec.tls_ca, sec.tls_cert, sec.tls_key, sec.auth_token_file);
    if (!security.ok()) return fail(std::string(security.status().message()));
    return RunServer(server, prompt, max_new_tokens, sp, ignore_eos, stops,
                     vm.count("logprobs") ? std::optional<int32_t>(logprobs) : std::nullopt,
                     request_id, wait_ready_seconds, *security, !vm["seed"].defaulted(),
                     *structured);
  }
  if (threads < 0) return fail("--threads must be >= 0");
  if (max_new_tokens < 0) return fail("--max-new-tokens must be >= 0");
  if (context < 0) return fail("--context must be >= 0");
  if (kv_type != "f32" && kv_type != "f16") return fail("--kv-type must be f32 or f16");
  if (absl::Status s = ValidateSamplingParams(sp); !s.ok()) return fail(std::string(s.message()));
  if (!split) {
    for (const char* flag : {"hot-fraction", "plan", "backend", "vram-budget", "instance", "cpus",
                             "numa-node", "mlock", "bindir", "worker-log"}) {
      if (vm.count(flag) && !vm[flag].defaulted()) {
        return fail(std::string("--") + flag + " needs --split");
      }
    }
  } else {
    if (vm.count("hot-fraction") && vm.count("plan")) {
      return fail("--split takes one of --hot-fraction F and --plan PLAN.gguf, not both");
    }
    const absl::StatusOr<int64_t> budget = driver::ApplyGpuBackendFlags(
        backend, vm.count("vram-budget") ? std::optional<std::string>(vram_budget) : std::nullopt,
        so);
    if (!budget.ok()) return fail(std::string(budget.status().message()));
    vram_budget_bytes = *budget;
    if (vm.count("hot-fraction")) so.hot_fraction = hot_fraction;
    // Neither given: RunSplit chooses, as the gateway does (shared/driver/default_placement.h).
    if (vm.count("numa-node")) so.numa_node = numa_node;
  }

  absl::StatusOr<TensorCheck> check = TensorCheckFromName(so.check_tensors);
  if (!check.ok()) return fail(std::string(check.status().message()));
  // With --split the workers load and check the weights; here only the description is needed
  // then, but the local engine computes from this very mapping.
  auto model_or = Model::Load(model_path, split ? TensorCheck::kOff : *check);
  if (!model_or.ok()) return fail(std::string(model_or.status().message()));
  const Model& model = **model_or;
  const Tokenizer& tok = model.tokenizer();
  auto setup = SparsitySetupFromFlags(model, sf, tf);
  if (!setup.ok()) return fail(std::string(setup.status().message()));
  if (split) {
    if (absl::Status s = CheckSplitTealPlan(setup->teal); !s.ok())
      return fail(std::string(s.message()));
  }
  // The FFN multiplied whole in this process: its Q4_0 and K-quant matrices get the
  // interleaved copy too. Under TEAL too: its decode rows read TEAL's transposed copies, but
  // the prompt's rows are dense GEMMs, which read the interleaved copy (433-token prompt on the
  // 24-layer Q4_0 model, 2 threads: 85-87 tok/s from the row layout, 159-160 interleaved), and
  // after the load nothing reads the file's FFN rows, so their pages may go.
  if (!split && setup->ffn.AllDense()) {
    if (absl::Status s = (*model_or)->InterleaveDenseFfn(); !s.ok()) {
      return fail(std::string(s.message()));
    }
  }

  GenerationRequest req;
  // BOS (and EOS) as the vocabulary says, as llama.cpp does (gpt-2-style BPE adds none).
  req.prompt = tok.Encode(prompt, EncodeOptions{.add_special = true});
  req.max_new_tokens = max_new_tokens;
  req.sampling = sp;
  req.ignore_eos = ignore_eos;
  std::unique_ptr<GrammarConstraint> constraint;
  if (structured->compiled) {
    constraint = std::make_unique<GrammarConstraint>(structured->compiled, tok, ignore_eos);
    req.constraint = constraint.get();
  }
  const int64_t needed = static_cast<int64_t>(req.prompt.size()) + max_new_tokens;
  int64_t capacity = context > 0 ? context : needed;
  if (capacity > model.config().context_length) {
    return fail(absl::StrFormat("prompt (%d tokens) + --max-new-tokens (%d) exceeds the model's "
                                "context of %d positions",
                                req.prompt.size(), max_new_tokens, model.config().context_length));
  }
  if (split) {
    return RunSplit(model, req, prompt, capacity, kv_type, sf, tf, vram_budget_bytes,
                    std::move(so));
  }
  auto kv_or = KvCache::Create(model.config(), 1, capacity,
                               kv_type == "f16" ? GgmlType::kF16 : GgmlType::kF32);
  if (!kv_or.ok()) return fail(std::string(kv_or.status().message()));
  const int n_threads = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(n_threads);
  auto executors = BuildLocalExecutors(model, std::move(*setup), pool);
  if (!executors.ok()) return fail(std::string(executors.status().message()));
  const SparseFfn* sparse = executors->ffn.get();
  const TealLinear* teal = executors->teal.get();
  ForwardPass pass(model, *kv_or, pool, executors->ffn.get(), executors->teal.get());

  ForwardPassRunner runner(pass);
  auto stats = GenerateAndPrint(runner, tok, prompt, req);
  if (!stats.ok()) return fail(std::string(stats.status().message()));
  std::cerr << absl::StrFormat(
      "prompt: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens, %.1f tok/s; %d threads, %s "
      "kernels, %s weights, %d bytes in interleaved copies\n",
      stats->prompt_tokens, stats->prefill_seconds,
      stats->prompt_tokens / std::max(1e-9, stats->prefill_seconds), stats->generated_tokens,
      stats->decode_steps / std::max(1e-9, stats->decode_seconds), n_threads,
      SimdLevelName(DetectSimdLevel()), model.weight_type_name(), model.interleaved_bytes());
  if (teal) {
    std::cerr << absl::StrFormat("teal: %.1f%% of the projection weights skipped per decode "
                                 "token (prompt positions dense)\n",
                                 100 * teal->MeasuredSparsity());
  }
  if (sparse) {
    std::cerr << absl::StrFormat("sparsity %s: %.1f%% of FFN neurons active\n", sf.mode,
                                 100 * sparse->ActiveRatio());
  }
  return 0;
}

CommandRegistrar reg({"generate",
                      "generate text from a prompt: in this process, split over the two worker "
                      "processes (--split), or from a running gateway (--server)",
                      &RunGenerate});

}  // namespace
}  // namespace thermocline::tools
