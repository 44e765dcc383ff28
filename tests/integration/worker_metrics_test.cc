// The workers' metrics from real processes: the test plays the gateway (creates the transport
// and the metrics segment, spawns thermocline-gpu-worker and thermocline-cpu-worker, sends
// Steps) and reads what the workers reported in the segment: the step counts equal the steps
// sent, every layer has time on both sides, the active-neuron ratios are in [0, 1] (exactly 1
// in dense mode), the predictor's recall is sampled in predicted mode, and a segment created
// after the workers started is picked up by them.
#include "shared/ipc/worker_metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/ipc/messages.h"
#include "shared/ipc/transport.h"
#include "tests/integration/worker_instance.h"
#include "tests/process_spawn.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using ipc::Role;

constexpr int kLayers = testing::kReluWorkerLayers;
constexpr uint32_t kVocab = testing::kReluWorkerVocab;

// WorkerInstance with the metrics segment the gateway would create, and one-token steps.
class Instance : public testing::WorkerInstance {
 public:
  explicit Instance(const std::string& tag) : WorkerInstance(absl::StrCat("wm-", tag)) {}

  void CreateMetrics() {
    auto m = ipc::WorkerMetricsRegion::Create(name());
    ASSERT_TRUE(m.ok()) << m.status();
    metrics_ = std::move(*m);
  }
  ipc::WorkerMetricsSnapshot Read(Role role) {
    auto s = metrics_->Read(role);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : ipc::WorkerMetricsSnapshot{};
  }

  // One decode step of one token at `position` in slot 0; true when Logits came back.
  bool Step(uint64_t step_id, int32_t position) {
    Send(step_id, {{0, position, static_cast<int32_t>(1 + (position * 37) % (kVocab - 1)),
                    ipc::kEntryWantsLogits}});
    return Reply(step_id, kVocab).ok();
  }

 private:
  std::unique_ptr<ipc::WorkerMetricsRegion> metrics_;
};

std::vector<std::string> Flags(const std::string& sparsity) {
  return {"--model",        testing::ReluWorkerModel(),
          "--threads",      "1",
          "--hot-fraction", "0.5",
          "--sparsity",     sparsity};
}

double Ratio(uint64_t a, uint64_t b) { return b == 0 ? -1 : static_cast<double>(a) / b; }

TEST(WorkerMetricsTest, DenseStepsLayerTimesAndFullRatios) {
  Instance inst("dense");
  inst.CreateMetrics();
  ASSERT_TRUE(inst.StartWorkers(Flags("dense"))) << inst.Log();
  constexpr int kSteps = 12;
  for (int i = 0; i < kSteps; ++i) ASSERT_TRUE(inst.Step(i + 1, i)) << inst.Log();
  const ipc::WorkerMetricsSnapshot gpu = inst.Read(Role::kGpuWorker);
  const ipc::WorkerMetricsSnapshot cpu = inst.Read(Role::kCpuWorker);
  EXPECT_EQ(gpu.steps, kSteps);
  EXPECT_EQ(gpu.rows, kSteps);
  // Dense with cold neurons: every layer sends one Activation per step and the CPU worker
  // answers each before the GPU worker replies, so its counts are complete too.
  EXPECT_EQ(gpu.activations, kSteps * kLayers);
  EXPECT_EQ(cpu.steps, kSteps);
  EXPECT_EQ(cpu.activations, kSteps * kLayers);
  ASSERT_EQ(gpu.layer_ns.size(), static_cast<size_t>(kLayers));
  ASSERT_EQ(cpu.layer_ns.size(), static_cast<size_t>(kLayers));
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_GT(gpu.layer_ns[l], 0u) << "layer " << l;
    EXPECT_GT(cpu.layer_ns[l], 0u) << "layer " << l;
  }
  // Dense runs every neuron of each side: 64 hot and 64 cold per layer and row.
  EXPECT_EQ(gpu.capacity_neurons, uint64_t{kSteps} * kLayers * 64);
  EXPECT_EQ(gpu.active_neurons, gpu.capacity_neurons);
  EXPECT_EQ(cpu.capacity_neurons, uint64_t{kSteps} * kLayers * 64);
  EXPECT_EQ(cpu.active_neurons, cpu.capacity_neurons);
  EXPECT_EQ(gpu.ring_waits, uint64_t{kSteps} * kLayers);  // one wait per cold partial
  EXPECT_EQ(gpu.recall_samples, 0u);                      // no predictor in dense mode
  EXPECT_GT(gpu.pid, 0);
  EXPECT_GT(cpu.pid, 0);
}

TEST(WorkerMetricsTest, PredictedRatiosAndRecall) {
  Instance inst("predicted");
  inst.CreateMetrics();
  ASSERT_TRUE(inst.StartWorkers(Flags("predicted"))) << inst.Log();
  constexpr int kSteps = 20;  // recall is sampled on the 16th step
  for (int i = 0; i < kSteps; ++i) ASSERT_TRUE(inst.Step(i + 1, i)) << inst.Log();
  const ipc::WorkerMetricsSnapshot gpu = inst.Read(Role::kGpuWorker);
  const ipc::WorkerMetricsSnapshot cpu = inst.Read(Role::kCpuWorker);
  EXPECT_EQ(gpu.steps, kSteps);
  // The CPU worker sees only the steps whose predictor picked cold neurons.
  EXPECT_LE(cpu.steps, uint64_t{kSteps});
  EXPECT_LE(cpu.activations, gpu.activations);
  for (int l = 0; l < kLayers; ++l) EXPECT_GT(gpu.layer_ns[l], 0u);
  const double hot = Ratio(gpu.active_neurons, gpu.capacity_neurons);
  EXPECT_GE(hot, 0.0);
  EXPECT_LE(hot, 1.0);
  EXPECT_LE(gpu.active_neurons, gpu.candidate_neurons);
  EXPECT_LE(gpu.candidate_neurons, gpu.capacity_neurons);
  if (cpu.capacity_neurons > 0) {
    EXPECT_LE(cpu.active_neurons, cpu.candidate_neurons);
    EXPECT_LE(cpu.candidate_neurons, cpu.capacity_neurons);
  }
  // One sampled step x one row x every layer.
  EXPECT_EQ(gpu.recall_samples, uint64_t{kLayers});
  const double recall =
      Ratio(gpu.recall_true_positive, gpu.recall_true_positive + gpu.recall_false_negative);
  if (recall >= 0) {
    EXPECT_LE(recall, 1.0);
  }
}

TEST(WorkerMetricsTest, WorkersPickUpASegmentCreatedLater) {
  Instance inst("late");
  ASSERT_TRUE(inst.StartWorkers(Flags("dense"))) << inst.Log();
  ASSERT_TRUE(inst.Step(1, 0)) << inst.Log();  // served without metrics
  inst.CreateMetrics();
  // The workers retry once a second, each on its own clock; steps keep being served meanwhile
  // until both report (on a loaded machine one may attach a step or more after the other).
  uint64_t step = 2;
  auto both_report = [&] {
    return inst.Read(Role::kGpuWorker).steps > 0 && inst.Read(Role::kCpuWorker).steps > 0;
  };
  for (int i = 0; i < 100 && !both_report(); ++i) {
    ASSERT_TRUE(inst.Step(step, static_cast<int32_t>(step - 1))) << inst.Log();
    ++step;
    if (step >= 60) break;  // the context is 64 positions
    usleep(50'000);
  }
  EXPECT_GT(inst.Read(Role::kGpuWorker).steps, 0u) << inst.Log();
  EXPECT_GT(inst.Read(Role::kCpuWorker).steps, 0u) << inst.Log();
  const std::string log = inst.Log();
  EXPECT_NE(log.find("metrics: not reporting yet"), std::string::npos) << log;
  EXPECT_NE(log.find("metrics: reporting to"), std::string::npos) << log;
}

}  // namespace
}  // namespace thermocline
