// thermocline-cpu-worker: the cold half of a split model (docs/workers.md). Attaches to an
// instance's transport, copies only the cold neurons' FFN rows into memory on its NUMA node,
// pins its threads, and answers every Activation from the GPU worker with a Partial.
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "cpu_worker/cold_executor.h"
#include "cpu_worker/cold_rows.h"
#include "cpu_worker/numa.h"
#include "cpu_worker/worker_loop.h"
#include "shared/ipc/worker_flags.h"
#include "shared/ipc/worker_session.h"
#include "shared/util/logfmt.h"
#include "shared/util/version.h"

using namespace thermocline;

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::printf("%s %s\n", "thermocline-cpu-worker", thermocline::Version());
    return 0;
  }
  ipc::WorkerFlags flags;
  int exit_code = 0;
  if (!ipc::ParseWorkerCommandLine(ipc::WorkerKind::kCpu, argc, argv, flags, exit_code)) {
    return exit_code;
  }
  const std::string& cpus_flag = flags.cpus;
  const bool lock = flags.mlock;
  std::vector<int> cpus;
  if (!cpus_flag.empty()) {
    auto parsed = cpu_worker::ParseCpuList(cpus_flag);
    if (!parsed.ok()) {
      Log(Level::kError, "start_failed", {{"error", std::string(parsed.status().message())}}, "cpu_worker");
      return 2;
    }
    cpus = *parsed;
  }

  auto session = ipc::WorkerSession::Start("cpu_worker", flags.instance, ipc::Role::kCpuWorker);
  if (!session.ok()) {
    Log(Level::kError, "attach_failed",
        {{"instance", flags.instance}, {"error", session.status().ToString()}}, "cpu_worker");
    return 1;
  }
  ipc::WorkerSession& s = **session;
  s.Log(Level::kInfo, "attached", {{"instance", flags.instance}, {"pid", getpid()}});
  // Pin before any thread exists: the pool's threads inherit the affinity.
  auto placed = cpu_worker::PlaceProcess(flags.numa_node, cpus);
  if (!placed.ok()) s.Fail(placed.status());
  s.Log(Level::kInfo, "placed", {{"msg", placed->description}});
  auto loaded = ipc::LoadWorkerModel(flags);
  if (!loaded.ok()) s.Fail(loaded.status());
  const ModelConfig& config = loaded->model->config();
  ThreadPool pool(flags.threads);
  auto rows = cpu_worker::ColdRows::Build(*loaded->model, loaded->partition, placed->node, pool,
                                          &loaded->plan);
  if (!rows.ok()) s.Fail(rows.status());
  if (lock) {
    if (absl::Status l = rows->memory().Lock(); !l.ok()) s.Fail(l);
  }
  int64_t cold = 0, neurons = 0;
  for (const LayerPartition& l : loaded->partition.layers) cold += l.n_cold();
  for (int64_t l = 0; l < config.n_layers; ++l) neurons += LayerNeurons(config, l);
  s.Log(Level::kInfo, "loaded",
        {{"model", flags.model_path}, {"cold_neurons", static_cast<long long>(cold)},
         {"neurons", static_cast<long long>(neurons)},
         {"cold_row_bytes", static_cast<long long>(rows->bytes())}, {"locked", lock},
         {"sparsity", flags.sparsity.mode}, {"threads", flags.threads}});
  cpu_worker::ColdExecutor executor(*rows, loaded->partition, loaded->plan, config.activation,
                                    pool);
  if (loaded->teal && loaded->teal->ffn) {
    if (absl::Status t = executor.EnableTeal(*loaded->teal); !t.ok()) s.Fail(t);
    if (lock) {
      if (absl::Status l = executor.LockTeal(); !l.ok()) s.Fail(l);
    }
    s.Log(Level::kInfo, "teal",
          {{"copy_bytes", static_cast<long long>(executor.teal_bytes())}, {"locked", lock}});
  }
  absl::Status run = cpu_worker::RunCpuWorker(s, executor, config);
  if (!run.ok()) s.Fail(run);
  s.SetStopped();
  return 0;
}
