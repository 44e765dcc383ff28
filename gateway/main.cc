// thermocline-gateway: serves thermocline.v1.Generation over gRPC from a model split between a
// gpu worker and a cpu worker (docs/gateway.md). Startup: gRPC and /metrics listen first (health
// NOT_SERVING, Generate UNAVAILABLE), then the model and the workers load, one warm-up step
// runs, health turns SERVING and systemd hears READY=1.
#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gateway/http_api.h"
#include "gateway/listen_address.h"
#include "gateway/log.h"
#include "gateway/metrics.h"
#include "gateway/reflection_v1.h"
#include "gateway/scheduler.h"
#include "gateway/security.h"
#include "gateway/service.h"
#include "gateway/split_serving_engine.h"
#include "shared/driver/default_placement.h"
#include "shared/driver/gpu_backend_flags.h"
#include "shared/driver/split_engine.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/sparsity_options.h"
#include "shared/sparsity/teal_options.h"
#include "shared/tokenizer/chat_prompt.h"
#include "shared/util/startup_environment.h"
#include "shared/util/version.h"

namespace thermocline::gateway {
namespace {

namespace po = boost::program_options;

constexpr char kServiceName[] = "thermocline.v1.Generation";
// Requests and replies are small (a prompt of at most 64 KiB, token chunks); 4 MiB leaves room
// for token-id prompts of a long context and refuses anything absurd before it is parsed.
constexpr int kMaxMessageBytes = 4 << 20;

int Fail(const std::string& msg) {
  std::cerr << "thermocline-gateway: " << msg << "\n";
  return 1;
}

// A file flag's path must name a readable regular file; checked before anything is started so
// that a typo ends startup at once with the flag's name, not minutes later inside a loader.
absl::Status CheckReadable(const std::string& flag, const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": cannot open (", std::strerror(errno), ")"));
  }
  close(fd);
  return absl::OkStatus();
}

// "HOST:PORT" with a port in [0, 65535] (IPv6 hosts in brackets: "[::1]:50051").
bool ValidListenAddress(const std::string& addr) {
  std::string host;
  int port = 0;
  return ParseListenAddress(addr, &host, &port);
}

// "host:port" -> the host part (for printing the bound address).
std::string HostOf(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  return colon == std::string::npos ? addr : addr.substr(0, colon);
}

int Main(int argc, char** argv) {
  std::string model_path, listen, metrics_listen, workers, backend, http_listen,
      chat_template_file;
  double hot_fraction = 0;
  SchedulerOptions sched;
  SparsityFlags sf;
  TealFlags tf;  // spawn mode: passed to the workers, which load the profile and check it
  driver::SplitEngineOptions so;
  int32_t context = 0;
  int32_t prefix_cache_blocks = -1;
  SecurityOptions security;
  std::string auth_token_file;
  double shutdown_grace = 2;
  int32_t max_concurrent = 0;
  double hang_timeout = 60;
  double stream_idle_timeout = 60;
  double write_timeout = 30;
  po::options_description opts("thermocline-gateway options");
  // clang-format off
  opts.add_options()
      ("help,h", "this help")
      ("version", "print the version and exit")
      ("model,m", po::value(&model_path), "model file (GGUF)")
      ("check-tensors", po::value(&so.check_tensors)->default_value("auto"), "the workers scan the weights for NaN/infinity at load: auto (files up to 2 GiB), on or off (norms and biases are always checked)")
      ("hot-fraction", po::value(&hot_fraction), "share of each layer's FFN neurons on the gpu worker, in [0, 1] (default without --plan: 1, the whole FFN, on the host backend; with cuda, a plan for --vram-budget or the device's free memory, ranked by --stats when given)")
      ("plan", po::value(&so.plan_path), "or: placement from `thermocline plan`")
      ("listen", po::value(&listen)->default_value("127.0.0.1:50051"), "gRPC address host:port (port 0: a free one)")
      ("metrics-listen", po::value(&metrics_listen)->default_value("127.0.0.1:9464"), "/metrics address host:port (port 0: a free one)")
      ("http-listen", po::value(&http_listen), "serve the OpenAI-compatible HTTP API (docs/http.md) on host:port, e.g. 127.0.0.1:8000 (port 0: a free one); not given: no HTTP API. TLS and the token as for gRPC")
      ("chat-template", po::value(&chat_template_file), "a Jinja chat template file that replaces the model's tokenizer.chat_template (Chat, /v1/chat/completions); a request's own template still wins")
      ("instance", po::value(&so.instance)->default_value("default"), "shared-memory instance name")
      ("workers", po::value(&workers)->default_value("spawn"), "spawn (start and restart the workers) or attach (systemd runs them)")
      ("max-batch", po::value(&sched.max_batch)->default_value(4), "sequences decoded together")
      ("max-queue", po::value(&sched.max_queue)->default_value(64), "requests waiting at most (more: RESOURCE_EXHAUSTED)")
      ("max-concurrent", po::value(&max_concurrent)->default_value(0), "Generate calls in flight at most (queued, running, or writing to a slow reader); more: RESOURCE_EXHAUSTED. 0: 2 x (--max-queue + --kv-slots)")
      ("kv-slots", po::value(&sched.kv_slots)->default_value(4), "KV cache slots (sequences held at once)")
      ("context", po::value(&context)->default_value(0), "positions per slot (0 = the model's context)")
      ("prefill-chunk", po::value(&sched.prefill_chunk)->default_value(64), "prompt positions per step")
      ("prefix-cache-blocks", po::value(&prefix_cache_blocks)->default_value(-1), "KV blocks of 16 positions kept beyond the slots' own for the prefix cache (docs/gateway.md#prefix-cache): prompts sharing a cached prefix skip its prefill, n > 1 choices share the prompt's blocks; 0: off; -1 (default): one slot's worth (context / 16) on the host backend, off on cuda and with --workers attach (an attached gpu worker must be given the same value)")
      ("max-pending-messages", po::value(&sched.max_pending_messages)->default_value(16), "messages a stream may have waiting for its reader; beyond, its sequence pauses (others go on) until the reader catches up")
      ("write-timeout", po::value(&write_timeout)->default_value(30), "seconds one streamed message may wait to be written to its caller (a reader that reads nothing) before the call is cancelled; 0: no limit")
      ("stream-idle-timeout", po::value(&stream_idle_timeout)->default_value(60), "seconds a paused stream (its reader reads nothing) keeps its KV slot before it is cancelled; 0: until the caller's deadline")
      ("backend", po::value(&backend)->default_value("host"), "the gpu worker's compute backend: host (this machine's CPU) or cuda (one CUDA device, docs/cuda.md; without --plan or --hot-fraction, planned for --vram-budget or the device's free memory); spawn mode")
      ("vram-budget", po::value<std::string>(), "with --backend cuda: device memory the gpu worker may use, e.g. 20G or 1.5GiB (0: the device's free memory, the default); spawn mode")
      ("gpu-threads", po::value(&so.gpu_threads)->default_value(1), "threads of the gpu worker")
      ("cpu-threads", po::value(&so.cpu_threads)->default_value(1), "threads of the cpu worker")
      ("kv-type", po::value(&so.kv_type)->default_value("f32"), "KV cache element type: f32 or f16")
      ("cpus", po::value(&so.cpus), "CPUs the cpu worker runs on, e.g. 0-7")
      ("numa-node", po::value<int>(), "NUMA node of the cpu worker's cold rows (and, without --cpus, of its threads)")
      ("mlock", po::bool_switch(&so.mlock), "lock the cpu worker's cold rows (and TEAL's copies of them) in memory, so that they are never paged out; needs RLIMIT_MEMLOCK to allow it (LimitMEMLOCK= in systemd)")
      ("bindir", po::value(&so.bindir), "directory of the worker executables (default: this one's)")
      ("worker-log", po::value(&so.log_path), "append the workers' output here (default: stderr)")
      ("shutdown-grace", po::value(&shutdown_grace)->default_value(2), "seconds in-flight streams get at SIGTERM to end by themselves; then they end with a Final of FINISH_REASON_CANCELLED")
      ("hang-timeout", po::value(&hang_timeout)->default_value(60), "seconds a worker's compute thread may go without progress (one layer's cold half, one step between cold exchanges) before it is taken for hung, killed and replaced, its heartbeat notwithstanding; 0: off")
      ("max-restarts", po::value(&so.restart.max_restarts)->default_value(5), "restarts of one worker allowed within a minute; past that the requests in flight fail UNAVAILABLE and the gateway exits with status 1 for its service manager to restart it")
      ("tls-cert", po::value(&security.tls_cert), "serve gRPC over TLS with this PEM certificate (chain)")
      ("tls-key", po::value(&security.tls_key), "the PEM private key of --tls-cert")
      ("tls-client-ca", po::value(&security.tls_client_ca), "mutual TLS: require client certificates signed by this PEM CA")
      ("auth-token-file", po::value(&auth_token_file), "require 'authorization: Bearer <token>' on every Generation call; the token is this file's first line");
  // clang-format on
  AddSparsityOptions(opts, sf);
  AddTealOptions(opts, tf);
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (vm.count("version")) {
    std::cout << "thermocline-gateway " << Version() << "\n";
    return 0;
  }
  if (model_path.empty()) return Fail("--model is required");
  // The spawned workers inherit this environment and would refuse it one after the other.
  if (absl::Status env = CheckEnvironmentSwitches(); !env.ok()) {
    return Fail(std::string(env.message()));
  }
  // The backend is the spawned gpu worker's flag; in attach mode the worker is started by
  // systemd with its own flags (THERMOCLINE_GPU_WORKER_ARGS), which this process cannot change.
  if (workers == "attach" && (!vm["backend"].defaulted() || vm.count("vram-budget"))) {
    return Fail("--backend and --vram-budget choose the backend of the gpu worker the gateway "
                "spawns; with --workers attach give them to thermocline-gpu-worker "
                "(THERMOCLINE_GPU_WORKER_ARGS in deploy/thermocline.env.example)");
  }
  // How the workers are started (threads, pinning, memory) is theirs to say in attach mode: given
  // here, it would be silently ignored.
  if (workers == "attach") {
    for (const char* flag : {"gpu-threads", "cpu-threads", "cpus", "numa-node", "mlock"}) {
      if (vm.count(flag) && !vm[flag].defaulted()) {
        return Fail(absl::StrCat(
            "--", flag,
            " sets how the gateway starts its workers; with --workers attach give the workers' "
            "own flags (--threads, --cpus, --numa-node, --mlock) on their lines "
            "(THERMOCLINE_GPU_WORKER_ARGS and THERMOCLINE_CPU_WORKER_ARGS)"));
      }
    }
  }
  // TEAL, likewise: the workers load the profile; attached ones take it on their own lines.
  if (workers == "attach" && (tf.sparsity.has_value() || !tf.profile_path.empty())) {
    return Fail(
        "--teal-sparsity and --teal-profile go to the workers the gateway spawns; with "
        "--workers attach give them to both workers (THERMOCLINE_GPU_WORKER_ARGS and "
        "THERMOCLINE_CPU_WORKER_ARGS)");
  }
  const absl::StatusOr<int64_t> vram_budget = driver::ApplyGpuBackendFlags(
      backend,
      vm.count("vram-budget") ? std::optional(vm["vram-budget"].as<std::string>()) : std::nullopt,
      so);
  if (!vram_budget.ok()) return Fail(std::string(vram_budget.status().message()));
  if (vm.count("hot-fraction") && vm.count("plan")) {
    return Fail("give one of --hot-fraction F and --plan PLAN, not both");
  }
  // Neither given: the host backend keeps the whole FFN hot (hot fraction 1); a device backend
  // gets a plan for its memory once the model's description is read (default_placement.h).
  const bool default_placement = !vm.count("hot-fraction") && !vm.count("plan");
  if (default_placement) hot_fraction = 1;
  if (vm.count("hot-fraction") || (default_placement && so.gpu_backend == "host")) {
    if (!(hot_fraction >= 0 && hot_fraction <= 1)) return Fail("--hot-fraction must be in [0, 1]");
    so.hot_fraction = hot_fraction;
  }
  if (workers != "spawn" && workers != "attach") {
    return Fail("--workers must be spawn or attach, got " + workers);
  }
  if (sched.max_batch < 1) return Fail("--max-batch must be >= 1");
  // Every request passes through the queue, even one that finds a slot free (admission happens
  // at the next step boundary), so 0 would refuse everything.
  if (sched.max_queue < 1) return Fail("--max-queue must be >= 1 (every request waits in the queue until the next step admits it)");
  if (sched.kv_slots < 1) return Fail("--kv-slots must be >= 1");
  if (max_concurrent < 0) return Fail("--max-concurrent must be >= 0 (0: the default)");
  // Room for every request the queue and the slots hold, and as many again finishing their
  // last writes: the limit bites only on callers that hold calls open without reading.
  if (max_concurrent == 0) max_concurrent = 2 * (sched.max_queue + sched.kv_slots);
  if (sched.prefill_chunk < 1) return Fail("--prefill-chunk must be >= 1");
  if (sched.max_pending_messages < 1) return Fail("--max-pending-messages must be >= 1");
  if (!(stream_idle_timeout >= 0 && stream_idle_timeout <= 86400)) {
    return Fail("--stream-idle-timeout must be in [0, 86400] seconds");
  }
  sched.stream_idle_timeout = absl::Seconds(stream_idle_timeout);
  if (!(write_timeout >= 0 && write_timeout <= 86400)) {
    return Fail("--write-timeout must be in [0, 86400] seconds");
  }
  if (context < 0) return Fail("--context must be >= 0");
  if (so.gpu_threads < 1 || so.cpu_threads < 1) return Fail("--gpu-threads and --cpu-threads must be >= 1");
  if (so.instance.empty()) return Fail("--instance must not be empty");
  if (vm.count("numa-node")) {
    if (vm["numa-node"].as<int>() < 0) return Fail("--numa-node must be >= 0");
    so.numa_node = vm["numa-node"].as<int>();
  }
  if (so.restart.max_restarts < 0) return Fail("--max-restarts must be >= 0");
  if (absl::StatusOr<TensorCheck> c = TensorCheckFromName(so.check_tensors); !c.ok()) {
    return Fail(std::string(c.status().message()));
  }
  if (!(hang_timeout >= 0 && hang_timeout <= 86400)) {
    return Fail("--hang-timeout must be in [0, 86400] seconds");
  }
  so.hang_timeout = absl::Seconds(hang_timeout);
  if (!(shutdown_grace >= 0 && shutdown_grace <= 3600)) {
    return Fail("--shutdown-grace must be in [0, 3600] seconds");
  }
  // SIGINT/SIGTERM are taken by a thread of their own (sigwait), blocked everywhere else; the
  // mask is set before anything can start a thread (gRPC starts its own when the credentials
  // below are made), since threads inherit it: a thread with SIGTERM unblocked would take the
  // signal's default action and kill the gateway without its cleanup. The workers are spawned
  // with an empty mask and default dispositions by the driver.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR2);  // main wakes the signal thread with it at the end
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  if (absl::Status s = CheckReadable("model", model_path); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (!so.plan_path.empty()) {
    if (absl::Status s = CheckReadable("plan", so.plan_path); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  if (!ValidListenAddress(listen)) {
    return Fail("--listen " + listen + ": not HOST:PORT with a port in [0, 65535]");
  }
  if (!http_listen.empty() && !ValidListenAddress(http_listen)) {
    return Fail("--http-listen " + http_listen + ": not HOST:PORT with a port in [0, 65535]");
  }
  std::string chat_template_source;
  if (vm.count("chat-template")) {
    auto source = ReadFlagFile("--chat-template", chat_template_file);
    if (!source.ok()) return Fail(std::string(source.status().message()));
    chat_template_source = *std::move(source);
  }
  if (!ValidListenAddress(metrics_listen)) {
    return Fail("--metrics-listen " + metrics_listen + ": not HOST:PORT with a port in [0, 65535]");
  }
  auto credentials = MakeServerCredentials(security);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));
  std::string auth_token;
  if (vm.count("auth-token-file")) {
    auto token = LoadAuthToken(auth_token_file);
    if (!token.ok()) return Fail(std::string(token.status().message()));
    auth_token = *std::move(token);
  }


  GatewayMetrics metrics;
  metrics.SetModelName(model_path.substr(model_path.rfind('/') + 1));  // as /v1/models says
  if (absl::Status s = metrics.AttachWorkerMetrics(so.instance); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (absl::Status s = metrics.Serve(metrics_listen); !s.ok()) {
    return Fail(absl::StrCat("--metrics-listen ", metrics_listen, ": ", s.message(),
                             " (a bad address, or the port is in use)"));
  }

  // The gateway tokenizes and sizes requests but never computes: it reads the model's header
  // alone (nothing mapped); the workers load and check the weights.
  auto model_or = ReadModelDescription(model_path);
  if (!model_or.ok()) return Fail(absl::StrCat("--model: ", model_or.status().message()));
  const ModelConfig& cfg = model_or->config;
  const Tokenizer& tokenizer = model_or->tokenizer;
  if (context == 0 || context > cfg.context_length) {
    if (context > cfg.context_length) {
      return Fail(absl::StrCat("--context ", context, " exceeds the model's context of ",
                               cfg.context_length));
    }
    // A file may say up to 2^31 positions; the KV cache refuses what the machine cannot hold,
    // naming the bytes, and --context caps it.
    context = static_cast<int32_t>(std::min<int64_t>(cfg.context_length, INT32_MAX));
  }

  driver::DefaultPlacement placed;
  absl::Cleanup remove_plan = [&placed] { driver::RemoveDefaultPlan(placed); };
  if (default_placement) {
    driver::DefaultPlacementOptions dp;
    dp.gpu_backend = so.gpu_backend;
    dp.model_path = model_path;
    dp.stats_path = sf.stats_path;
    dp.predictor_path = sf.predictor_path;
    dp.vram_budget = *vram_budget;
    dp.context = context;
    dp.kv_slots = sched.kv_slots;
    dp.kv_type = so.kv_type;
    dp.bindir = so.bindir;
    absl::StatusOr<driver::DefaultPlacement> chosen = driver::ChooseDefaultPlacement(dp);
    if (!chosen.ok()) return Fail(std::string(chosen.status().message()));
    placed = std::move(*chosen);
    if (placed.hot_fraction.has_value()) {
      so.hot_fraction = *placed.hot_fraction;
      Log(Level::kInfo, "placement_default",
          {{"hot_fraction", *placed.hot_fraction}, {"why", placed.why}});
    } else {
      so.plan_path = placed.plan_path;
      Log(Level::kInfo, "placement_default",
          {{"plan", placed.plan_path},
           {"budget_bytes", static_cast<long long>(placed.budget)},
           {"gpu_ffn_share", placed.gpu_ffn_share},
           {"why", placed.why}});
    }
  }

  RequestLimits limits;
  // A plan charged one KV configuration against the VRAM budget; serving another would hold a
  // different amount than planned (too much: out of memory on the device).
  if (!so.plan_path.empty()) {
    absl::StatusOr<Placement> plan = ReadPlacement(so.plan_path);
    if (!plan.ok()) return Fail(std::string(plan.status().message()));
    if (plan->kv_slots == 0) {
      Log(Level::kWarn, "plan_kv_unknown",
          {{"plan", so.plan_path},
           {"note", "the plan does not record the KV cache it was made for (made by PowerInfer "
                    "or an older thermocline plan); its VRAM budget may not hold this one"}});
    } else if (plan->kv_slots != sched.kv_slots || plan->kv_context != context ||
               plan->kv_type != so.kv_type) {
      return Fail(absl::StrCat(
          "--plan ", so.plan_path, " was made for a KV cache of ", plan->kv_slots, " slots x ",
          plan->kv_context, " positions (", plan->kv_type, "); this gateway allocates ",
          sched.kv_slots, " slots x ", context, " positions (", so.kv_type,
          "): make the plan with `thermocline plan --kv-slots ", sched.kv_slots, " --context ",
          context, " --kv-type ", so.kv_type, "`, or start the gateway with the plan's"));
    }
  }
  limits.context = context;
  limits.vocab_size = static_cast<int32_t>(cfg.vocab_size);
  v1::ModelInfo info;
  info.set_model(model_path.substr(model_path.rfind('/') + 1));
  info.set_architecture(cfg.arch_name());
  info.set_vocab_size(static_cast<int32_t>(cfg.vocab_size));
  info.set_context_length(context);
  info.set_n_layers(static_cast<int32_t>(cfg.n_layers));
  info.set_embedding_dim(static_cast<int32_t>(cfg.dim));
  info.set_ffn_dim(static_cast<int32_t>(cfg.ffn_dim));
  info.set_bos_token_id(tokenizer.bos());
  info.set_eos_token_id(tokenizer.eos());
  info.set_max_batch(sched.max_batch);
  info.set_max_queue(sched.max_queue);
  info.set_max_new_tokens_limit(context);
  info.set_max_prompt_bytes(limits.max_prompt_bytes);
  info.set_max_stop_strings(limits.max_stop_strings);
  info.set_max_top_logprobs(limits.max_top_logprobs);
  info.set_sparsity(sf.mode);
  info.set_hot_fraction(so.hot_fraction.value_or(0));
  info.set_plan(so.plan_path);
  info.set_workers(workers);
  // Chat's template and the BOS/EOS texts it is rendered with, from the header as well.
  auto header = GgufFile::OpenHeader(model_path);
  if (!header.ok()) return Fail(absl::StrCat("--model: ", header.status().message()));
  ModelChatTemplate chat_source = ReadModelChatTemplate(**header);
  header->reset();
  if (vm.count("chat-template")) chat_source.source = chat_template_source;
  ModelChat model_chat = PrepareModelChat(info.model(), chat_source);
  if (vm.count("chat-template") && !model_chat.parse_error.ok()) {
    return Fail(absl::StrCat("--chat-template ", chat_template_file, ": ",
                             model_chat.parse_error.message()));
  }
  if (!model_chat.parse_error.ok()) {
    Log(Level::kWarn, "chat_template_unusable",
        {{"error", std::string(model_chat.parse_error.message())}});
  }
  GenerationService service(tokenizer, limits, info, std::move(model_chat));
  service.SetAuthToken(auth_token);
  service.SetMaxConcurrent(max_concurrent);
  service.SetWriteTimeout(absl::Seconds(write_timeout));
  HttpApi http(service);
  if (!http_listen.empty()) {
    // As many connections as --max-concurrent calls, and room for probes and model queries.
    const HttpOptions http_options{.listen = http_listen,
                                   .tls = security,
                                   .write_timeout = absl::Seconds(write_timeout),
                                   .threads = max_concurrent + 8};
    if (absl::Status s = http.Serve(http_options); !s.ok()) return Fail(std::string(s.message()));
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(listen, *credentials, &grpc_port);
  // gRPC sets SO_REUSEPORT by default, so a second server on a busy port would "succeed" and
  // share the traffic with the first; without it a port in use is an error here.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&service);
  // v1 beside Debian's v1alpha plugin: current generic clients ask for v1 first.
  ReflectionV1Service reflection_v1({"thermocline.v1.Generation", "grpc.health.v1.Health",
                                     "grpc.reflection.v1alpha.ServerReflection",
                                     "grpc.reflection.v1.ServerReflection"});
  builder.RegisterService(&reflection_v1);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || grpc_port == 0) {
    return Fail("--listen " + listen + ": cannot listen (a bad address, or the port is in use)");
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  auto set_health = [health, &http](bool serving) {
    health->SetServingStatus(serving);  // overall ("")
    health->SetServingStatus(kServiceName, serving);
    http.SetServing(serving);
  };
  set_health(false);  // loading
  std::cout << "listening grpc=" << HostOf(listen) << ":" << grpc_port
            << " metrics=" << HostOf(metrics_listen) << ":" << metrics.port() << " http="
            << (http_listen.empty() ? std::string("off")
                                    : absl::StrCat(HostOf(http_listen), ":", http.port()))
            << std::endl;

  std::atomic<bool> stopping{false};
  std::atomic<bool> worker_lost{false};  // attach mode: a worker died (see below)
  std::atomic<Scheduler*> live_scheduler{nullptr};
  std::atomic<bool> gave_up{false};
  std::string given_up_reason;  // written once, before gave_up is read as true  // spawn mode: a worker's restart budget is spent (below)
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == SIGUSR2) return;  // woken by main at the end
    stopping.store(true);
    Log(Level::kInfo, "shutdown", {{"signal", sig}, {"grace_seconds", shutdown_grace}});
    sd_notify(0, "STOPPING=1");
    // In-flight streams get the grace to end; then each gets its Final (CANCELLED) at the next
    // step boundary. A step that never comes back is waited for 5 s, then gRPC's deadline
    // cancels whatever call is left, and the handlers return.
    constexpr absl::Duration kBoundaryWait = absl::Seconds(5);
    if (Scheduler* s = live_scheduler.load()) s->Drain(absl::Seconds(shutdown_grace), kBoundaryWait);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });

  so.model_path = model_path;
  so.config = cfg;
  so.sparsity = sf;
  so.teal = tf;
  so.kv_slots = sched.kv_slots + 1;  // + the probe slot (scheduler.h)
  so.context = context;
  if (prefix_cache_blocks < -1) return Fail("--prefix-cache-blocks must be >= -1");
  so.prefix_cache_blocks =
      prefix_cache_blocks >= 0
          ? prefix_cache_blocks
          : (so.gpu_backend == "host" && workers != "attach"
                 ? static_cast<int32_t>(KvCache::BlocksFor(context))
                 : 0);
  sched.fork_choices = so.prefix_cache_blocks > 0;
  so.max_batch = sched.max_batch + sched.prefill_chunk;  // one step is never cut
  so.max_logits_rows = sched.max_batch;
  so.attach = workers == "attach";
  Log(Level::kInfo, "loading", {{"model", model_path}, {"instance", so.instance},
                                {"workers", workers}, {"backend", so.gpu_backend}});
  auto engine = driver::SplitEngine::Create(so);
  int rc = 0;
  std::unique_ptr<Scheduler> scheduler;
  if (!engine.ok()) {
    rc = Fail(std::string(engine.status().message()));
  } else {
    Log(Level::kInfo, "workers_ready",
        {{"gpu_pid", static_cast<int>((*engine)->worker_pid(ipc::Role::kGpuWorker))},
         {"cpu_pid", static_cast<int>((*engine)->worker_pid(ipc::Role::kCpuWorker))}});
    // Warm-up: one step through both workers before READY, so the first request does not pay
    // for page faults and ring setup, and a worker that cannot compute fails startup.
    std::vector<float> logits;
    const BatchEntry warm{sched.kv_slots, 0, tokenizer.bos(), true};
    if (absl::Status s = (*engine)->Run(std::span<const BatchEntry>(&warm, 1), logits); !s.ok()) {
      rc = Fail(absl::StrCat("warm-up step failed: ", s.message()));
    } else {
      (*engine)->ReleaseSlot(sched.kv_slots);
      metrics.SetWorkerUp("gpu_worker", true);
      metrics.SetWorkerUp("cpu_worker", true);
      scheduler = std::make_unique<Scheduler>(
          std::make_unique<SplitServingEngine>(*std::move(engine)), tokenizer, sched,
          &metrics,
          [&set_health, &worker_lost, &stopping, attach = so.attach](bool serving, const std::string& why) {
            set_health(serving);
            Log(serving ? Level::kInfo : Level::kWarn, serving ? "serving" : "not_serving",
                {{"reason", why}});
            // Attach mode: the dead worker belongs to systemd, which restarts it, but this
            // gateway cannot take a new worker in (its transport and KV state are gone with
            // the old one). Exiting non-zero lets Restart=on-failure bring the whole instance
            // back; the surviving worker exits when it sees the gateway gone.
            if (attach && !serving && !stopping.load() && !worker_lost.exchange(true)) {
              kill(getpid(), SIGTERM);
            }
          },
          [&set_health, &gave_up, &given_up_reason](const absl::Status& why) {
            // The restart budget is spent: restarting again at once would crash-loop, and
            // staying up idle would leave the instance down until a request happens to come
            // (a load balancer that honours health sends none). Exiting non-zero hands the
            // decision to the service manager (Restart=on-failure, its own delay and limits).
            if (gave_up.exchange(true)) return;
            given_up_reason = std::string(why.message());
            set_health(false);
            Log(Level::kError, "giving_up", {{"error", std::string(why.message())}});
            kill(getpid(), SIGTERM);
          });
      service.SetScheduler(scheduler.get());
      live_scheduler.store(scheduler.get());
      set_health(true);
      Log(Level::kInfo, "serving", {{"port", grpc_port}});
      sd_notify(0, "READY=1");
    }
  }

  // Watchdog: WATCHDOG=1 only while the scheduler makes progress (a step completed since the
  // last ping) or has nothing to do; a scheduler stuck in a step stops the pings and systemd
  // restarts the unit. A no-op without WATCHDOG_USEC (sd_watchdog_enabled returns 0).
  std::atomic<bool> done{false};
  std::thread watchdog;
  uint64_t usec = 0;
  if (scheduler && sd_watchdog_enabled(0, &usec) > 0) {
    watchdog = std::thread([&, usec] {
      uint64_t last = scheduler->progress();
      while (!done.load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(usec / 3));
        const uint64_t now = scheduler->progress();
        if (now != last || scheduler->idle()) sd_notify(0, "WATCHDOG=1");
        last = now;
      }
    });
  }

  if (rc == 0) server->Wait();
  done.store(true);
  if (watchdog.joinable()) watchdog.join();
  if (!stopping.load()) {
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
    pthread_kill(signal_thread.native_handle(), SIGUSR2);
  }
  signal_thread.join();
  live_scheduler.store(nullptr);
  http.Stop();  // its handlers hold streams of the scheduler
  service.SetScheduler(nullptr);
  scheduler.reset();  // ends what still runs, then the engine stops the workers
  metrics.Stop();
  if (gave_up.load() && rc == 0) {
    rc = Fail(absl::StrCat("the workers cannot be brought back (", given_up_reason,
                           "); exiting for the service manager to restart the instance"));
  }
  if (worker_lost.load() && rc == 0) {
    rc = Fail("a worker died and --workers attach cannot restart it; exiting for the service "
              "manager to restart the instance");
  }
  return rc;
}

}  // namespace
}  // namespace thermocline::gateway

int main(int argc, char** argv) { return thermocline::gateway::Main(argc, argv); }
