#include "gateway/metrics.h"

#include <algorithm>

#include <httplib.h>

#include <sys/socket.h>

#include <charconv>
#include <map>
#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gateway/listen_address.h"
#include "gateway/log.h"
#include "prometheus/text_serializer.h"

namespace thermocline::gateway {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Buckets (seconds) sized for a workstation: a small model streams a token in a millisecond, a
// 70B one in a fraction of a second; prefill of a long prompt on the CPU can take tens of
// seconds.
const prometheus::Histogram::BucketBoundaries kTtftBuckets = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
const prometheus::Histogram::BucketBoundaries kInterTokenBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
const prometheus::Histogram::BucketBoundaries kE2eBuckets = {
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
const prometheus::Histogram::BucketBoundaries kQueueBuckets = {
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
const prometheus::Histogram::BucketBoundaries kBatchBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

// Connections /metrics serves at once (see Serve).
constexpr size_t kMetricsThreads = 32;

constexpr std::string_view kProcesses[] = {"gpu_worker", "cpu_worker", "gateway"};

ClientMetric Sample(std::vector<ClientMetric::Label> labels, MetricType type, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}


}  // namespace

GatewayMetrics::GatewayMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  queue_ = &prometheus::BuildHistogram()
                .Name("thermocline_queue_time_seconds")
                .Help("Time from a request's arrival to its first scheduled step")
                .Register(r)
                .Add({}, kQueueBuckets);
  ttft_ = &prometheus::BuildHistogram()
               .Name("thermocline_time_to_first_token_seconds")
               .Help("Time from a request's arrival to its first streamed token")
               .Register(r)
               .Add({}, kTtftBuckets);
  inter_token_ = &prometheus::BuildHistogram()
                      .Name("thermocline_inter_token_latency_seconds")
                      .Help("Time between two consecutive tokens of one stream")
                      .Register(r)
                      .Add({}, kInterTokenBuckets);
  e2e_ = &prometheus::BuildHistogram()
              .Name("thermocline_request_duration_seconds")
              .Help("Time from a request's arrival to its final message")
              .Register(r)
              .Add({}, kE2eBuckets);
  batch_ = &prometheus::BuildHistogram()
                .Name("thermocline_batch_size")
                .Help("Entries (sequences) in each step sent to the gpu worker")
                .Register(r)
                .Add({}, kBatchBuckets);
  prompt_tokens_ = &prometheus::BuildCounter()
                        .Name("thermocline_prompt_tokens_total")
                        .Help("Prompt tokens of admitted requests")
                        .Register(r)
                        .Add({});
  generated_tokens_ = &prometheus::BuildCounter()
                           .Name("thermocline_generated_tokens_total")
                           .Help("Tokens generated and streamed")
                           .Register(r)
                           .Add({});
  requests_ = &prometheus::BuildCounter()
                   .Name("thermocline_requests_total")
                   .Help("Finished requests by outcome")
                   .Register(r);
  running_ = &prometheus::BuildGauge()
                  .Name("thermocline_requests_running")
                  .Help("Requests holding a KV slot")
                  .Register(r)
                  .Add({});
  waiting_ = &prometheus::BuildGauge()
                  .Name("thermocline_requests_waiting")
                  .Help("Requests queued for a KV slot")
                  .Register(r)
                  .Add({});
  kv_used_ = &prometheus::BuildGauge()
                  .Name("thermocline_kv_slots_used")
                  .Help("KV cache slots in use")
                  .Register(r)
                  .Add({});
  kv_total_ = &prometheus::BuildGauge()
                   .Name("thermocline_kv_slots_total")
                   .Help("KV cache slots of the gpu worker")
                   .Register(r)
                   .Add({});
  prefix_hits_ = &prometheus::BuildCounter()
                      .Name("thermocline_prefix_cache_hit_tokens_total")
                      .Help("Prompt tokens whose KV blocks were found in the prefix cache")
                      .Register(r)
                      .Add({});
  prefix_misses_ = &prometheus::BuildCounter()
                        .Name("thermocline_prefix_cache_miss_tokens_total")
                        .Help("Prompt tokens looked up in the prefix cache and computed")
                        .Register(r)
                        .Add({});
  prefix_queries_ = &prometheus::BuildCounter()
                         .Name("thermocline_prefix_cache_query_tokens_total")
                         .Help("Prompt tokens looked up in the prefix cache (hits + misses)")
                         .Register(r)
                         .Add({});
  prefix_evictions_ = &prometheus::BuildCounter()
                           .Name("thermocline_prefix_cache_evictions_total")
                           .Help("Cached KV blocks taken for other use (LRU)")
                           .Register(r)
                           .Add({});
  prefix_blocks_ = &prometheus::BuildGauge()
                        .Name("thermocline_prefix_cache_blocks")
                        .Help("KV blocks registered in the prefix cache (in use or not)")
                        .Register(r)
                        .Add({});
  worker_up_ = &prometheus::BuildGauge()
                    .Name("thermocline_worker_up")
                    .Help("1 while the process serves, 0 while it is down or restarting")
                    .Register(r);
  worker_restarts_ = &prometheus::BuildCounter()
                          .Name("thermocline_worker_restarts_total")
                          .Help("Restarts of the process by the gateway's supervisor")
                          .Register(r);
  // Every process has its series from the start, so dashboards see 0 rather than nothing.
  for (std::string_view p : kProcesses) {
    worker_up_->Add({{"process", std::string(p)}}).Set(p == "gateway" ? 1 : 0);
    worker_restarts_->Add({{"process", std::string(p)}});
  }
}

GatewayMetrics::~GatewayMetrics() { Stop(); }

void GatewayMetrics::ObserveQueueSeconds(double s) { queue_->Observe(s); }
void GatewayMetrics::ObserveTtftSeconds(double s) { ttft_->Observe(s); }
void GatewayMetrics::ObserveInterTokenSeconds(double s) { inter_token_->Observe(s); }
void GatewayMetrics::ObserveE2eSeconds(double s) { e2e_->Observe(s); }
void GatewayMetrics::AddPromptTokens(int64_t n) {
  if (n > 0) prompt_tokens_->Increment(static_cast<double>(n));
}
void GatewayMetrics::AddGeneratedTokens(int64_t n) {
  if (n > 0) generated_tokens_->Increment(static_cast<double>(n));
}
void GatewayMetrics::CountRequest(std::string_view outcome) {
  requests_->Add({{"outcome", std::string(outcome)}}).Increment();
}
void GatewayMetrics::SetRunning(int64_t n) { running_->Set(static_cast<double>(n)); }
void GatewayMetrics::SetWaiting(int64_t n) { waiting_->Set(static_cast<double>(n)); }
void GatewayMetrics::ObserveBatchSize(int64_t entries) {
  batch_->Observe(static_cast<double>(entries));
}
void GatewayMetrics::SetKvSlotsUsed(int64_t used, int64_t total) {
  kv_used_->Set(static_cast<double>(used));
  kv_total_->Set(static_cast<double>(total));
}
void GatewayMetrics::SetPrefixCache(int64_t hit_tokens, int64_t query_tokens,
                                    int64_t evictions, int64_t cached_blocks) {
  std::lock_guard<std::mutex> lock(prefix_mu_);
  const int64_t hits = hit_tokens - seen_hits_, queries = query_tokens - seen_queries_;
  if (hits > 0) prefix_hits_->Increment(static_cast<double>(hits));
  if (queries > 0) prefix_queries_->Increment(static_cast<double>(queries));
  if (queries - hits > 0) prefix_misses_->Increment(static_cast<double>(queries - hits));
  if (evictions > seen_evictions_) {
    prefix_evictions_->Increment(static_cast<double>(evictions - seen_evictions_));
  }
  seen_hits_ = std::max(seen_hits_, hit_tokens);
  seen_queries_ = std::max(seen_queries_, query_tokens);
  seen_evictions_ = std::max(seen_evictions_, evictions);
  prefix_blocks_->Set(static_cast<double>(cached_blocks));
}
void GatewayMetrics::SetWorkerUp(std::string_view role, bool up) {
  worker_up_->Add({{"process", std::string(role)}}).Set(up ? 1 : 0);
}
void GatewayMetrics::IncWorkerRestarts(std::string_view role) {
  worker_restarts_->Add({{"process", std::string(role)}}).Increment();
}

absl::Status GatewayMetrics::AttachWorkerMetrics(const std::string& instance) {
  auto region = ipc::WorkerMetricsRegion::Create(instance);
  if (absl::IsFailedPrecondition(region.status())) {
    // A live process owns it (perhaps this one): read it without owning it.
    region = ipc::WorkerMetricsRegion::Attach(instance);
  }
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrCat("worker metrics of instance '", instance,
                                     "': ", region.status().message()));
  }
  std::lock_guard<std::mutex> lock(workers_mu_);
  worker_region_ = std::move(*region);
  return absl::OkStatus();
}

std::vector<MetricFamily> GatewayMetrics::CollectWorkers() const {
  std::lock_guard<std::mutex> lock(workers_mu_);
  if (worker_region_ == nullptr) return {};
  MetricFamily steps = Family("thermocline_worker_steps_total",
                              "Steps computed (gpu_worker: Steps served; cpu_worker: steps that "
                              "reached it)",
                              MetricType::Counter);
  MetricFamily layer = Family("thermocline_layer_seconds_total",
                              "Time per layer (gpu_worker: attention + hot FFN + the wait for the "
                              "cold partial; cpu_worker: cold FFN)",
                              MetricType::Counter);
  MetricFamily ratio = Family("thermocline_active_neuron_ratio",
                              "Share of the side's FFN neurons that ran, since the instance "
                              "started (side: hot on the gpu_worker, cold on the cpu_worker)",
                              MetricType::Gauge);
  MetricFamily active = Family("thermocline_active_neurons_total",
                               "FFN neurons that ran, summed over token rows", MetricType::Counter);
  MetricFamily candidates = Family("thermocline_candidate_neurons_total",
                                   "FFN neurons considered (predicted or all), summed over rows",
                                   MetricType::Counter);
  MetricFamily capacity = Family("thermocline_neurons_total",
                                 "FFN neurons the side holds, summed over rows (the ratios' "
                                 "denominator)",
                                 MetricType::Counter);
  MetricFamily recall = Family("thermocline_predictor_recall",
                               "Predictor recall on the hot neurons against the exact active set, "
                               "sampled every 16th step in predicted layers",
                               MetricType::Gauge);
  MetricFamily recall_samples = Family("thermocline_predictor_recall_samples_total",
                                       "Token rows x layers the recall was sampled on",
                                       MetricType::Counter);
  MetricFamily wait = Family("thermocline_ring_wait_seconds_total",
                             "Time blocked on the rings (gpu_worker: waiting for cold partials; "
                             "cpu_worker: waiting for space to send them)",
                             MetricType::Counter);
  MetricFamily waits = Family("thermocline_ring_waits_total", "Waits counted in ring_wait_seconds",
                              MetricType::Counter);
  for (ipc::Role role : {ipc::Role::kGpuWorker, ipc::Role::kCpuWorker}) {
    absl::StatusOr<ipc::WorkerMetricsSnapshot> s = worker_region_->Read(role);
    const std::string process(ipc::RoleName(role));
    if (!s.ok()) {
      Log(Level::kWarn, "worker_metrics_unreadable",
          {{"process", process}, {"error", std::string(s.status().message())}});
      continue;
    }
    const std::string side = role == ipc::Role::kGpuWorker ? "hot" : "cold";
    std::vector<ClientMetric::Label> p = {{"process", process}};
    std::vector<ClientMetric::Label> ps = {{"process", process}, {"side", side}};
    steps.metric.push_back(Sample(p, MetricType::Counter, static_cast<double>(s->steps)));
    for (size_t l = 0; l < s->layer_ns.size(); ++l) {
      layer.metric.push_back(Sample({{"layer", std::to_string(l)}, {"process", process}},
                                    MetricType::Counter, s->layer_ns[l] * 1e-9));
    }
    if (s->capacity_neurons > 0) {
      ratio.metric.push_back(Sample(ps, MetricType::Gauge,
                                    static_cast<double>(s->active_neurons) /
                                        static_cast<double>(s->capacity_neurons)));
    }
    active.metric.push_back(Sample(ps, MetricType::Counter, static_cast<double>(s->active_neurons)));
    candidates.metric.push_back(
        Sample(ps, MetricType::Counter, static_cast<double>(s->candidate_neurons)));
    capacity.metric.push_back(
        Sample(ps, MetricType::Counter, static_cast<double>(s->capacity_neurons)));
    if (role == ipc::Role::kGpuWorker) {
      const uint64_t truly_active = s->recall_true_positive + s->recall_false_negative;
      if (truly_active > 0) {
        recall.metric.push_back(Sample(p, MetricType::Gauge,
                                       static_cast<double>(s->recall_true_positive) /
                                           static_cast<double>(truly_active)));
      }
      recall_samples.metric.push_back(
          Sample(p, MetricType::Counter, static_cast<double>(s->recall_samples)));
    }
    wait.metric.push_back(Sample(p, MetricType::Counter, s->ring_wait_ns * 1e-9));
    waits.metric.push_back(Sample(p, MetricType::Counter, static_cast<double>(s->ring_waits)));
  }
  std::vector<MetricFamily> out;
  for (MetricFamily* f : {&steps, &layer, &ratio, &active, &candidates, &capacity, &recall,
                          &recall_samples, &wait, &waits}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  return out;
}

void GatewayMetrics::SetModelName(std::string name) { model_name_ = std::move(name); }

std::vector<MetricFamily> GatewayMetrics::VllmAliases(
    const std::vector<MetricFamily>& families) const {
  // Same samples, vLLM's names, so dashboards built for vLLM work. Only metrics whose meaning
  // is the same are aliased (docs/metrics.md lists them); vLLM's carry model_name.
  static constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
      {"thermocline_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"},
      {"thermocline_inter_token_latency_seconds", "vllm:time_per_output_token_seconds"},
      {"thermocline_inter_token_latency_seconds", "vllm:inter_token_latency_seconds"},
      {"thermocline_request_duration_seconds", "vllm:e2e_request_latency_seconds"},
      {"thermocline_queue_time_seconds", "vllm:request_queue_time_seconds"},
      {"thermocline_requests_running", "vllm:num_requests_running"},
      {"thermocline_requests_waiting", "vllm:num_requests_waiting"},
      {"thermocline_prompt_tokens_total", "vllm:prompt_tokens_total"},
      {"thermocline_generated_tokens_total", "vllm:generation_tokens_total"},
      {"thermocline_prefix_cache_query_tokens_total", "vllm:prefix_cache_queries_total"},
      {"thermocline_prefix_cache_hit_tokens_total", "vllm:prefix_cache_hits_total"},
  };
  std::vector<MetricFamily> out;
  for (const auto& [ours, theirs] : kAliases) {
    for (const MetricFamily& f : families) {
      if (f.name != ours) continue;
      MetricFamily alias = f;
      alias.name = std::string(theirs);
      alias.help = absl::StrCat(f.help, " (vLLM's name for ", std::string(ours), ")");
      for (ClientMetric& m : alias.metric) m.label.push_back({"model_name", model_name_});
      out.push_back(std::move(alias));
    }
  }
  // vllm:request_success_total{finished_reason}: finished requests by vLLM's reasons (stop:
  // EOS, a stop token or string, a completed grammar; length; abort: ended by the server).
  for (const MetricFamily& f : families) {
    if (f.name != "thermocline_requests_total") continue;
    std::map<std::string, double> by_reason = {{"stop", 0}, {"length", 0}, {"abort", 0}};
    for (const ClientMetric& m : f.metric) {
      for (const ClientMetric::Label& l : m.label) {
        if (l.name != "outcome") continue;
        if (l.value == "eos" || l.value == "stop_sequence" || l.value == "grammar") {
          by_reason["stop"] += m.counter.value;
        }
        if (l.value == "length") by_reason["length"] += m.counter.value;
        if (l.value == "cancelled") by_reason["abort"] += m.counter.value;
      }
    }
    MetricFamily success = Family("vllm:request_success_total",
                                  "Finished requests by finished_reason (vLLM's name; from "
                                  "thermocline_requests_total)",
                                  MetricType::Counter);
    for (const auto& [reason, n] : by_reason) {
      success.metric.push_back(Sample({{"finished_reason", reason}, {"model_name", model_name_}},
                                      MetricType::Counter, n));
    }
    out.push_back(std::move(success));
  }
  return out;
}

std::string GatewayMetrics::RenderText() const {
  std::vector<MetricFamily> families = registry_->Collect();
  std::vector<MetricFamily> aliases = VllmAliases(families);
  families.insert(families.end(), std::make_move_iterator(aliases.begin()),
                  std::make_move_iterator(aliases.end()));
  std::vector<MetricFamily> workers = CollectWorkers();
  families.insert(families.end(), std::make_move_iterator(workers.begin()),
                  std::make_move_iterator(workers.end()));
  return prometheus::TextSerializer().Serialize(families);
}

absl::Status GatewayMetrics::Serve(const std::string& listen_addr) {
  std::string host;
  int port = 0;
  if (!ParseListenAddress(listen_addr, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics listen address '", listen_addr, "' is not HOST:PORT"));
  }
  std::lock_guard<std::mutex> lock(server_mu_);
  if (server_ != nullptr) return absl::FailedPreconditionError("metrics server already running");
  auto server = std::make_unique<httplib::Server>();
  // httplib serves a connection per pool thread for as long as it stays open (idle keep-alive
  // connections up to keep_alive_timeout, 5 s), and its default pool is max(8, cores - 1): 8 idle
  // connections on a small machine would queue every scrape behind them. A pool well above what
  // scrapers open keeps /metrics answering; the pool's threads are created once, here.
  server->new_task_queue = [] { return new httplib::ThreadPool(kMetricsThreads); };
  // httplib's default also sets SO_REUSEPORT, which would let two gateways share a metrics port
  // and split the scrapes between them; a taken port must be an error instead.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const int bound = port == 0 ? server->bind_to_any_port(host) : server->bind_to_port(host, port)
                                                                      ? port
                                                                      : -1;
  if (bound < 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", listen_addr));
  }
  port_ = bound;
  httplib::Server* raw = server.get();
  server_ = std::move(server);
  server_thread_ = std::thread([raw] { raw->listen_after_bind(); });
  // httplib's stop() only shuts the socket down once the listen loop runs; a Stop() that came
  // first would be lost and the join would hang. The loop marks itself running as it starts.
  // (Serve holds server_mu_, so no Stop() can end the loop before it is seen running.)
  while (!raw->is_running()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  Log(Level::kInfo, "metrics_listening", {{"address", absl::StrCat(host, ":", bound)}});
  return absl::OkStatus();
}

int GatewayMetrics::port() const {
  std::lock_guard<std::mutex> lock(server_mu_);
  return port_;
}

void GatewayMetrics::Stop() {
  std::lock_guard<std::mutex> lock(server_mu_);
  if (server_ == nullptr) return;
  server_->stop();
  if (server_thread_.joinable()) server_thread_.join();
  server_.reset();
  port_ = 0;
}

}  // namespace thermocline::gateway
