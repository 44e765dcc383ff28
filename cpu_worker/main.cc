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
      std::fprintf(stderr, "cpu_worker: %s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    cpus = *parsed;
  }

  auto session = ipc::WorkerSession::Start("cpu_worker", flags.instance, ipc::Role::kCpuWorker);
  if (!session.ok()) {
    std::fprintf(stderr, "cpu_worker: cannot attach to instance '%s': %s\n",
                 flags.instance.c_str(), session.status().ToString().c_str());
    return 1;
  }
  ipc::WorkerSession& s = **session;
  s.Log(absl::StrCat("attached to instance '", flags.instance, "' (pid ", getpid(), ")"));
  // Pin before any thread exists: the pool's threads inherit the affinity.
  auto placed = cpu_worker::PlaceProcess(flags.numa_node, cpus);
  if (!placed.ok()) s.Fail(placed.status());
  s.Log(placed->description);
  auto loaded = ipc::LoadWorkerModel(flags);
  if (!loaded.ok()) s.Fail(loaded.status());
  const ModelConfig& config = loaded->model->config();
  ThreadPool pool(flags.threads);
  auto rows = cpu_worker::ColdRows::Build(*loaded->model, loaded->partition, placed->node, pool);
  if (!rows.ok()) s.Fail(rows.status());
  if (lock) {
    if (absl::Status l = rows->memory().Lock(); !l.ok()) s.Fail(l);
  }
  int64_t cold = 0, neurons = 0;
  for (const LayerPartition& l : loaded->partition.layers) cold += l.n_cold();
  for (int64_t l = 0; l < config.n_layers; ++l) neurons += LayerNeurons(config, l);
  s.Log(absl::StrCat("loaded ", flags.model_path, ": ", cold, " of ", neurons,
                     " FFN neurons cold, ", rows->bytes(),
                     " bytes of cold rows", lock ? " (locked)" : "", ", sparsity ",
                     flags.sparsity.mode, ", ", flags.threads, " threads"));
  cpu_worker::ColdExecutor executor(*rows, loaded->partition, loaded->plan, config.activation,
                                    pool);
  absl::Status run = cpu_worker::RunCpuWorker(s, executor, config);
  if (!run.ok()) s.Fail(run);
  s.SetStopped();
  return 0;
}
