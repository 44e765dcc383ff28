// The gateway's Prometheus metrics (docs/metrics.md): request latencies, token counts, queue
// and batch state, KV slot use, and every worker's own numbers, all served as Prometheus text
// at GET /metrics by a cpp-httplib server (prometheus-cpp's own web server crashes next to
// OpenBLAS/cuBLAS thread-locals; only prometheus-cpp core is used).
//
// The workers do not serve HTTP: they add to the instance's metrics segment
// (shared/ipc/worker_metrics.h) and this class turns its counters into metrics with a `process`
// label at scrape time, so a scrape always sees the workers' latest sums and the workers never
// block on a scraper. Every method is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "shared/ipc/worker_metrics.h"

namespace httplib {
class Server;
}

namespace thermocline::gateway {

class GatewayMetrics {
 public:
  GatewayMetrics();
  // Stops the server (if serving) and removes the worker metrics segment it created.
  ~GatewayMetrics();
  GatewayMetrics(const GatewayMetrics&) = delete;
  GatewayMetrics& operator=(const GatewayMetrics&) = delete;

  void ObserveQueueSeconds(double seconds);
  void ObserveTtftSeconds(double seconds);
  void ObserveInterTokenSeconds(double seconds);
  void ObserveE2eSeconds(double seconds);
  void AddPromptTokens(int64_t n);
  void AddGeneratedTokens(int64_t n);
  // outcome: a short fixed word ("eos", "length", "stop_sequence", "cancelled",
  // "invalid_argument", ...); each distinct value is one time series, so never a request id.
  void CountRequest(std::string_view outcome);
  void SetRunning(int64_t n);
  void SetWaiting(int64_t n);
  void ObserveBatchSize(int64_t entries);
  void SetKvSlotsUsed(int64_t used, int64_t total);
  // The prefix cache's totals since the engine started (PrefixCacheStats): the counters grow by
  // what changed since the last call, the gauge is set.
  void SetPrefixCache(int64_t hit_tokens, int64_t query_tokens, int64_t evictions,
                      int64_t cached_blocks);
  // role: "gpu_worker", "cpu_worker" or "gateway" (the `process` label).
  void SetWorkerUp(std::string_view role, bool up);
  void IncWorkerRestarts(std::string_view role);

  // Creates the instance's worker metrics segment (thermocline-<instance>-metrics), which the
  // workers attach to, or attaches to it when a live process (this one, for instance) already
  // created it. Call before or after spawning the workers: they retry every second. Replaces a
  // previously attached instance.
  absl::Status AttachWorkerMetrics(const std::string& instance);

  // Serves GET /metrics on `listen_addr` ("host:port"; port 0 picks a free one, see port()) from
  // a thread of its own; other paths get 404. InvalidArgument for a bad address, Unavailable
  // when the port cannot be bound, FailedPrecondition when already serving.
  absl::Status Serve(const std::string& listen_addr);
  int port() const;
  // Stops serving and joins the thread; idempotent.
  void Stop();

  // The `model_name` label of the vLLM-named aliases (docs/metrics.md); set before serving.
  void SetModelName(std::string name);

  // The exposition text a scrape gets (also for tests and logs).
  std::string RenderText() const;

 private:
  std::vector<prometheus::MetricFamily> CollectWorkers() const;
  // The families that mean what a vLLM metric means, again under vLLM's name.
  std::vector<prometheus::MetricFamily> VllmAliases(
      const std::vector<prometheus::MetricFamily>& families) const;

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* inter_token_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Histogram* batch_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generated_tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* kv_used_ = nullptr;
  prometheus::Gauge* kv_total_ = nullptr;
  prometheus::Counter* prefix_hits_ = nullptr;
  prometheus::Counter* prefix_misses_ = nullptr;
  prometheus::Counter* prefix_queries_ = nullptr;
  prometheus::Counter* prefix_evictions_ = nullptr;
  prometheus::Gauge* prefix_blocks_ = nullptr;
  std::mutex prefix_mu_;  // guards the totals last seen
  int64_t seen_hits_ = 0, seen_queries_ = 0, seen_evictions_ = 0;
  prometheus::Family<prometheus::Gauge>* worker_up_ = nullptr;
  prometheus::Family<prometheus::Counter>* worker_restarts_ = nullptr;

  std::string model_name_;
  mutable std::mutex workers_mu_;  // guards worker_region_
  std::unique_ptr<ipc::WorkerMetricsRegion> worker_region_;

  mutable std::mutex server_mu_;  // guards server_, server_thread_, port_
  std::unique_ptr<httplib::Server> server_;
  std::thread server_thread_;
  int port_ = 0;
};

}  // namespace thermocline::gateway
