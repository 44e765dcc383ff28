// GatewayMetrics (gateway/metrics.h) through its real HTTP endpoint: serve on port 0, observe,
// GET /metrics with cpp-httplib's client, parse the Prometheus text and check names, labels and
// values; the worker metrics come from a real metrics segment written by a WorkerMetricsWriter
// (what the workers use), and a corrupted segment is refused, not read out of bounds.
#include "gateway/metrics.h"

#include <fcntl.h>
#include <httplib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/ipc/worker_metrics.h"

namespace thermocline::gateway {
namespace {

// "name{labels}" -> value, for every sample line of the exposition text.
std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    EXPECT_NE(sp, std::string::npos) << line;
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

std::string Scrape(int port, const std::string& path = "/metrics", int* status = nullptr) {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get(path.c_str());
  EXPECT_TRUE(res) << "GET " << path << ": " << httplib::to_string(res.error());
  if (!res) return "";
  if (status != nullptr) *status = res->status;
  return res->body;
}

std::string UniqueInstance(const std::string& tag) {
  static int counter = 0;
  return absl::StrCat("mtest-", tag, "-", getpid(), "-", counter++);
}

TEST(GatewayMetricsTest, ServesObservationsOverHttp) {
  GatewayMetrics m;
  ASSERT_TRUE(m.Serve("127.0.0.1:0").ok());
  ASSERT_GT(m.port(), 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(m.Serve("127.0.0.1:0")));

  m.ObserveQueueSeconds(0.002);
  m.ObserveTtftSeconds(0.03);
  m.ObserveTtftSeconds(0.2);
  m.ObserveInterTokenSeconds(0.004);
  m.ObserveE2eSeconds(1.5);
  m.AddPromptTokens(12);
  m.AddPromptTokens(3);
  m.AddGeneratedTokens(5);
  m.CountRequest("eos");
  m.CountRequest("eos");
  m.CountRequest("invalid_argument");
  m.SetRunning(2);
  m.SetWaiting(7);
  m.ObserveBatchSize(3);
  m.SetKvSlotsUsed(2, 4);
  m.SetWorkerUp("gpu_worker", true);
  m.SetWorkerUp("cpu_worker", false);
  m.IncWorkerRestarts("cpu_worker");

  int status = 0;
  const std::string body = Scrape(m.port(), "/metrics", &status);
  EXPECT_EQ(status, 200);
  auto s = ParseSamples(body);
  EXPECT_EQ(s["thermocline_prompt_tokens_total"], 15);
  EXPECT_EQ(s["thermocline_generated_tokens_total"], 5);
  EXPECT_EQ(s["thermocline_requests_total{outcome=\"eos\"}"], 2);
  EXPECT_EQ(s["thermocline_requests_total{outcome=\"invalid_argument\"}"], 1);
  EXPECT_EQ(s["thermocline_requests_running"], 2);
  EXPECT_EQ(s["thermocline_requests_waiting"], 7);
  EXPECT_EQ(s["thermocline_kv_slots_used"], 2);
  EXPECT_EQ(s["thermocline_kv_slots_total"], 4);
  EXPECT_EQ(s["thermocline_time_to_first_token_seconds_count"], 2);
  EXPECT_DOUBLE_EQ(s["thermocline_time_to_first_token_seconds_sum"], 0.23);
  // Cumulative buckets: 0.03 falls in le=0.05, 0.2 in le=0.25.
  EXPECT_EQ(s["thermocline_time_to_first_token_seconds_bucket{le=\"0.025\"}"], 0);
  EXPECT_EQ(s["thermocline_time_to_first_token_seconds_bucket{le=\"0.05\"}"], 1);
  EXPECT_EQ(s["thermocline_time_to_first_token_seconds_bucket{le=\"0.25\"}"], 2);
  EXPECT_EQ(s["thermocline_time_to_first_token_seconds_bucket{le=\"+Inf\"}"], 2);
  EXPECT_EQ(s["thermocline_inter_token_latency_seconds_count"], 1);
  EXPECT_EQ(s["thermocline_request_duration_seconds_count"], 1);
  EXPECT_EQ(s["thermocline_queue_time_seconds_count"], 1);
  EXPECT_EQ(s["thermocline_batch_size_bucket{le=\"2\"}"], 0);
  EXPECT_EQ(s["thermocline_batch_size_bucket{le=\"4\"}"], 1);
  EXPECT_EQ(s["thermocline_worker_up{process=\"gpu_worker\"}"], 1);
  EXPECT_EQ(s["thermocline_worker_up{process=\"cpu_worker\"}"], 0);
  EXPECT_EQ(s["thermocline_worker_up{process=\"gateway\"}"], 1);
  EXPECT_EQ(s["thermocline_worker_restarts_total{process=\"cpu_worker\"}"], 1);
  EXPECT_EQ(s["thermocline_worker_restarts_total{process=\"gpu_worker\"}"], 0);
  EXPECT_NE(body.find("# TYPE thermocline_time_to_first_token_seconds histogram"),
            std::string::npos);
  // Nothing about workers without their segment.
  EXPECT_EQ(body.find("thermocline_layer_seconds_total"), std::string::npos);

  Scrape(m.port(), "/other", &status);
  EXPECT_EQ(status, 404);

  // Observations after a scrape show in the next one.
  m.AddGeneratedTokens(2);
  EXPECT_EQ(ParseSamples(Scrape(m.port()))["thermocline_generated_tokens_total"], 7);

  const int port = m.port();
  m.Stop();
  m.Stop();  // idempotent
  httplib::Client client("127.0.0.1", port);
  EXPECT_FALSE(client.Get("/metrics"));
}

// Item 5 of issue 14: the metrics that mean what vLLM's mean are served again under vLLM's
// names (with its model_name label), same samples, so vLLM dashboards work unchanged.
TEST(GatewayMetricsTest, VllmAliasesRepeatTheSamplesUnderVllmNames) {
  GatewayMetrics m;
  m.SetModelName("m.gguf");
  ASSERT_TRUE(m.Serve("127.0.0.1:0").ok());
  m.ObserveTtftSeconds(0.03);
  m.ObserveTtftSeconds(0.2);
  m.ObserveInterTokenSeconds(0.004);
  m.ObserveE2eSeconds(1.5);
  m.ObserveQueueSeconds(0.002);
  m.AddPromptTokens(12);
  m.AddGeneratedTokens(5);
  m.SetRunning(2);
  m.SetWaiting(7);
  m.CountRequest("eos");
  m.CountRequest("stop_sequence");
  m.CountRequest("length");
  m.CountRequest("cancelled");
  m.CountRequest("error");  // no vLLM reason: not in request_success_total
  const std::string body = Scrape(m.port());
  auto s = ParseSamples(body);
  const std::string l = "{model_name=\"m.gguf\"}";
  EXPECT_EQ(s["vllm:num_requests_running" + l], 2);
  EXPECT_EQ(s["vllm:num_requests_waiting" + l], 7);
  EXPECT_EQ(s["vllm:prompt_tokens_total" + l], 12);
  EXPECT_EQ(s["vllm:generation_tokens_total" + l], 5);
  EXPECT_EQ(s["vllm:time_to_first_token_seconds_count" + l], 2);
  EXPECT_DOUBLE_EQ(s["vllm:time_to_first_token_seconds_sum" + l], 0.23);
  EXPECT_EQ(s["vllm:time_to_first_token_seconds_bucket{model_name=\"m.gguf\",le=\"0.05\"}"], 1);
  EXPECT_EQ(s["vllm:time_to_first_token_seconds_bucket{model_name=\"m.gguf\",le=\"+Inf\"}"], 2);
  EXPECT_EQ(s["vllm:time_per_output_token_seconds_count" + l], 1);
  EXPECT_EQ(s["vllm:inter_token_latency_seconds_count" + l], 1);
  EXPECT_DOUBLE_EQ(s["vllm:e2e_request_latency_seconds_sum" + l], 1.5);
  EXPECT_EQ(s["vllm:request_queue_time_seconds_count" + l], 1);
  EXPECT_EQ(s["vllm:request_success_total{finished_reason=\"stop\",model_name=\"m.gguf\"}"], 2);
  EXPECT_EQ(s["vllm:request_success_total{finished_reason=\"length\",model_name=\"m.gguf\"}"], 1);
  EXPECT_EQ(s["vllm:request_success_total{finished_reason=\"abort\",model_name=\"m.gguf\"}"], 1);
  EXPECT_NE(body.find("# TYPE vllm:e2e_request_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(body.find("# TYPE vllm:num_requests_running gauge"), std::string::npos);
  // The originals are still there, unchanged.
  EXPECT_EQ(s["thermocline_time_to_first_token_seconds_count"], 2);
  EXPECT_EQ(s["thermocline_requests_total{outcome=\"error\"}"], 1);
}

TEST(GatewayMetricsTest, RefusesBadAddresses) {
  GatewayMetrics m;
  EXPECT_TRUE(absl::IsInvalidArgument(m.Serve("nonsense")));
  EXPECT_TRUE(absl::IsInvalidArgument(m.Serve("127.0.0.1:")));
  EXPECT_TRUE(absl::IsInvalidArgument(m.Serve("127.0.0.1:70000")));
  EXPECT_TRUE(absl::IsInvalidArgument(m.Serve("127.0.0.1:12x")));
  // A port already taken.
  GatewayMetrics first;
  ASSERT_TRUE(first.Serve("127.0.0.1:0").ok());
  EXPECT_TRUE(absl::IsUnavailable(m.Serve(absl::StrCat("127.0.0.1:", first.port()))));
}

TEST(GatewayMetricsTest, WorkerMetricsFromTheSegment) {
  const std::string instance = UniqueInstance("workers");
  const std::string shm = absl::StrCat("/dev/shm/thermocline-", instance, "-metrics");
  {
    GatewayMetrics m;
    ASSERT_TRUE(m.AttachWorkerMetrics(instance).ok());
    struct stat st {};
    ASSERT_EQ(stat(shm.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_TRUE(m.Serve("127.0.0.1:0").ok());

    // Writers as the workers use them (here in this process; the integration test uses the
    // real worker processes).
    ipc::WorkerMetricsWriter gpu(instance, ipc::Role::kGpuWorker, 3, nullptr);
    ipc::WorkerMetricsWriter cpu(instance, ipc::Role::kCpuWorker, 3, nullptr);
    ASSERT_TRUE(gpu.MaybeAttach());
    ASSERT_TRUE(cpu.MaybeAttach());
    for (int step = 0; step < 4; ++step) {
      gpu.AddStep(2);
      for (int l = 0; l < 3; ++l) gpu.AddLayerNs(l, 1'000'000 * (l + 1));  // 1, 2, 3 ms
      gpu.AddNeurons(30, 60, 100);
      gpu.AddRingWait(500'000);
      cpu.AddStep(2);
      cpu.AddLayerNs(2, 250'000'000);
      cpu.AddNeurons(10, 40, 200);
    }
    gpu.AddRecall(5, 9, 1);

    auto s = ParseSamples(Scrape(m.port()));
    EXPECT_EQ(s["thermocline_worker_steps_total{process=\"gpu_worker\"}"], 4);
    EXPECT_EQ(s["thermocline_worker_steps_total{process=\"cpu_worker\"}"], 4);
    EXPECT_DOUBLE_EQ(s["thermocline_layer_seconds_total{layer=\"0\",process=\"gpu_worker\"}"], 0.004);
    EXPECT_DOUBLE_EQ(s["thermocline_layer_seconds_total{layer=\"2\",process=\"gpu_worker\"}"], 0.012);
    EXPECT_DOUBLE_EQ(s["thermocline_layer_seconds_total{layer=\"2\",process=\"cpu_worker\"}"], 1.0);
    EXPECT_EQ(s["thermocline_layer_seconds_total{layer=\"0\",process=\"cpu_worker\"}"], 0);
    EXPECT_DOUBLE_EQ(s["thermocline_active_neuron_ratio{process=\"gpu_worker\",side=\"hot\"}"], 0.3);
    EXPECT_DOUBLE_EQ(s["thermocline_active_neuron_ratio{process=\"cpu_worker\",side=\"cold\"}"], 0.05);
    EXPECT_EQ(s["thermocline_active_neurons_total{process=\"gpu_worker\",side=\"hot\"}"], 120);
    EXPECT_EQ(s["thermocline_candidate_neurons_total{process=\"cpu_worker\",side=\"cold\"}"], 160);
    EXPECT_EQ(s["thermocline_neurons_total{process=\"cpu_worker\",side=\"cold\"}"], 800);
    EXPECT_DOUBLE_EQ(s["thermocline_predictor_recall{process=\"gpu_worker\"}"], 0.9);
    EXPECT_EQ(s["thermocline_predictor_recall_samples_total{process=\"gpu_worker\"}"], 5);
    EXPECT_DOUBLE_EQ(s["thermocline_ring_wait_seconds_total{process=\"gpu_worker\"}"], 0.002);
    EXPECT_EQ(s["thermocline_ring_waits_total{process=\"gpu_worker\"}"], 4);

    // A restarted worker keeps adding to the same sums: counters never go back.
    ipc::WorkerMetricsWriter gpu2(instance, ipc::Role::kGpuWorker, 3, nullptr);
    ASSERT_TRUE(gpu2.MaybeAttach());
    gpu2.AddStep(1);
    s = ParseSamples(Scrape(m.port()));
    EXPECT_EQ(s["thermocline_worker_steps_total{process=\"gpu_worker\"}"], 5);

    // Scribbled layer count (as a broken or hostile process could write): the gpu block is
    // refused, the cpu block still reported, nothing read past the segment.
    int fd = open(shm.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    void* p = mmap(nullptr, sizeof(ipc::WorkerMetricsLayout), PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
    close(fd);
    ASSERT_NE(p, MAP_FAILED);
    auto* layout = static_cast<ipc::WorkerMetricsLayout*>(p);
    layout->workers[0].n_layers.store(1u << 30);
    const std::string body = Scrape(m.port());
    s = ParseSamples(body);
    EXPECT_EQ(body.find("thermocline_worker_steps_total{process=\"gpu_worker\"}"), std::string::npos);
    EXPECT_EQ(s["thermocline_worker_steps_total{process=\"cpu_worker\"}"], 4);
    munmap(p, sizeof(ipc::WorkerMetricsLayout));
  }
  // The segment goes with the GatewayMetrics that created it.
  struct stat st {};
  EXPECT_NE(stat(shm.c_str(), &st), 0);
}

TEST(GatewayMetricsTest, WriterWithoutSegmentCarriesOn) {
  const std::string instance = UniqueInstance("nosegment");
  std::vector<std::string> logged;
  ipc::WorkerMetricsWriter w(instance, ipc::Role::kCpuWorker, 2,
                             [&](const std::string& line) { logged.push_back(line); });
  EXPECT_FALSE(w.MaybeAttach());
  EXPECT_FALSE(w.MaybeAttach());  // within the second: no retry, no second log line
  w.AddStep(1);                   // no-ops
  w.AddLayerNs(1, 5);
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("metrics: not reporting"), std::string::npos) << logged[0];
  // The segment appears later: the writer attaches at its next try (a second after the last).
  GatewayMetrics m;
  ASSERT_TRUE(m.AttachWorkerMetrics(instance).ok());
  bool attached = false;
  for (int i = 0; i < 40 && !attached; ++i) {
    attached = w.MaybeAttach();
    if (!attached) usleep(100'000);
  }
  EXPECT_TRUE(attached);
  w.AddStep(3);
  EXPECT_NE(m.RenderText().find("thermocline_worker_steps_total{process=\"cpu_worker\"} 1"),
            std::string::npos);
}

TEST(GatewayMetricsTest, AttachToAnInstanceThisProcessAlreadyServes) {
  const std::string instance = UniqueInstance("twice");
  GatewayMetrics a, b;
  ASSERT_TRUE(a.AttachWorkerMetrics(instance).ok());
  // The second finds a live owner (this process) and reads the same segment.
  ASSERT_TRUE(b.AttachWorkerMetrics(instance).ok());
  ipc::WorkerMetricsWriter w(instance, ipc::Role::kGpuWorker, 1, nullptr);
  ASSERT_TRUE(w.MaybeAttach());
  w.AddStep(1);
  EXPECT_NE(b.RenderText().find("thermocline_worker_steps_total{process=\"gpu_worker\"} 1"),
            std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(b.AttachWorkerMetrics("bad/name")));
}

}  // namespace
}  // namespace thermocline::gateway
