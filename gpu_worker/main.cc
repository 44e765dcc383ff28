// thermocline-gpu-worker: the dense half of a split model (docs/workers.md). Attaches to an
// instance's transport, loads the model with its placement and sparsity plan, and serves Steps
// from the gateway, exchanging every layer's cold neurons with the CPU worker.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gpu_worker/host/host_backend.h"
#if THERMOCLINE_HAVE_CUDA
#include "gpu_worker/cuda/cuda_backend.h"
#endif
#include "gpu_worker/worker_loop.h"
#include "shared/ipc/worker_flags.h"
#include "shared/ipc/worker_session.h"
#include "shared/sparsity/planner.h"
#include "shared/util/logfmt.h"
#include "shared/util/version.h"

using namespace thermocline;

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::printf("%s %s\n", "thermocline-gpu-worker", thermocline::Version());
    return 0;
  }
  // `--device-memory`: one logfmt line on stdout with the device's free and total memory, for
  // a caller that plans a placement from it (shared/driver/default_placement.h); no instance.
  if (argc == 2 && std::string(argv[1]) == "--device-memory") {
#if THERMOCLINE_HAVE_CUDA
    const int device = 0;
    absl::StatusOr<gpu_worker::CudaDeviceMemory> m = gpu_worker::QueryCudaDeviceMemory(device);
    if (!m.ok()) {
      Log(Level::kError, "start_failed",
          {{"error", "--device-memory: no usable CUDA device: " + std::string(m.status().message())}},
          "gpu_worker");
      return 1;
    }
    std::printf("%s\n", FormatLogLine(LogTimestamp(), Level::kInfo, "gpu_worker", "device_memory",
                                       {{"device", device},
                                        {"name", m->name},
                                        {"free_bytes", static_cast<long long>(m->free_bytes)},
                                        {"total_bytes", static_cast<long long>(m->total_bytes)}})
                             .c_str());
    return 0;
#else
    Log(Level::kError, "start_failed",
        {{"error", "--device-memory: this gpu worker was built without CUDA (configure with "
                   "-DTHERMOCLINE_CUDA=ON on a machine with nvcc)"}},
        "gpu_worker");
    return 2;
#endif
  }
  ipc::WorkerFlags flags;
  int exit_code = 0;
  if (!ipc::ParseWorkerCommandLine(ipc::WorkerKind::kGpu, argc, argv, flags, exit_code)) {
    return exit_code;
  }
  const std::string& backend_name = flags.backend;
  const std::string& kv_type = flags.kv_type;
  const std::string& vram_budget = flags.vram_budget;
  gpu_worker::HostBackendOptions options;
  options.n_kv_slots = flags.kv_slots;
  options.context = flags.context;
  options.max_batch = flags.max_batch;
  options.prefix_cache_blocks = flags.prefix_cache_blocks;
  auto usage_error = [](const std::string& msg) {
    Log(Level::kError, "start_failed", {{"error", msg}}, "gpu_worker");
    return 2;
  };
  if (backend_name != "host" && backend_name != "cuda") {
    return usage_error("--backend " + backend_name + " is not available; backends: host, cuda");
  }
#if !THERMOCLINE_HAVE_CUDA
  if (backend_name == "cuda") {
    return usage_error("--backend cuda: this binary was built without CUDA (configure with "
                       "-DTHERMOCLINE_CUDA=ON on a machine with nvcc); use --backend host");
  }
#else
  // Checked before attaching, like the other flags: a machine without a device is told at once.
  if (backend_name == "cuda") {
    if (absl::Status s = gpu_worker::CudaAvailable(); !s.ok()) {
      return usage_error("--backend cuda: no usable CUDA device: " + std::string(s.message()));
    }
  }
#endif
  // The syntax of `thermocline plan --vram-budget`, which the gateway and `generate --split`
  // check with the same function before they start this worker.
  const absl::StatusOr<int64_t> budget_bytes = ParseByteSize(vram_budget);
  if (!budget_bytes.ok()) {
    return usage_error("--vram-budget: " + std::string(budget_bytes.status().message()));
  }
  if (kv_type != "f32" && kv_type != "f16") return usage_error("--kv-type must be f32 or f16");
  if (options.context < 0) return usage_error("--context must be >= 0");
  if (options.prefix_cache_blocks < 0) return usage_error("--prefix-cache-blocks must be >= 0");
  if (options.prefix_cache_blocks > 0 && backend_name != "host") {
    return usage_error("--prefix-cache-blocks: the " + backend_name +
                       " backend keeps a contiguous KV cache; use 0 (off)");
  }
  options.kv_type = kv_type == "f16" ? GgmlType::kF16 : GgmlType::kF32;
  options.threads = flags.threads;

  auto session = ipc::WorkerSession::Start("gpu_worker", flags.instance, ipc::Role::kGpuWorker);
  if (!session.ok()) {
    Log(Level::kError, "attach_failed",
        {{"instance", flags.instance}, {"error", session.status().ToString()}}, "gpu_worker");
    return 1;
  }
  ipc::WorkerSession& s = **session;
  s.Log(Level::kInfo, "attached", {{"instance", flags.instance}, {"pid", getpid()}});
  auto loaded = ipc::LoadWorkerModel(flags);
  if (!loaded.ok()) s.Fail(loaded.status());
  const ModelConfig& config = loaded->model->config();
  // The gateway's default on the host backend: every layer dense and wholly here. Nothing then
  // reads the FFN by neuron, so its Q4_0 matrices may take the interleaved copy the dense
  // products read (docs/performance.md, "Q4_0 interleaved 8 rows"; THERMOCLINE_REPACK=0: off).
  if (backend_name == "host") {
    bool all_hot = true;
    for (const LayerPartition& l : loaded->partition.layers) all_hot = all_hot && l.cold.empty();
    if (loaded->plan.AllDense() && all_hot) {
      if (absl::Status st = loaded->model->InterleaveDenseFfn(); !st.ok()) s.Fail(st);
    }
  }
  int64_t hot = 0, neurons = 0;
  for (const LayerPartition& l : loaded->partition.layers) hot += static_cast<int64_t>(l.hot.size());
  for (int64_t l = 0; l < config.n_layers; ++l) neurons += LayerNeurons(config, l);
  s.Log(Level::kInfo, "loaded",
        {{"model", flags.model_path}, {"layers", static_cast<long long>(config.n_layers)},
         {"hot_neurons", static_cast<long long>(hot)}, {"neurons", static_cast<long long>(neurons)},
         {"sparsity", flags.sparsity.mode}, {"threads", flags.threads},
         {"interleaved_bytes", static_cast<long long>(loaded->model->interleaved_bytes())}});
  absl::StatusOr<std::unique_ptr<gpu_worker::Backend>> backend;
  if (loaded->teal && backend_name != "host") {
    s.Fail(absl::InvalidArgumentError("TEAL (--teal-sparsity) runs on the host backend only"));
  }
  options.teal = std::move(loaded->teal);
  if (backend_name == "host") {
    backend = gpu_worker::HostBackend::Create(*loaded->model, std::move(loaded->plan),
                                              std::move(loaded->partition), options);
  }
#if THERMOCLINE_HAVE_CUDA
  if (backend_name == "cuda") {
    gpu_worker::CudaBackendOptions cuda;
    cuda.threads = options.threads;
    cuda.n_kv_slots = options.n_kv_slots;
    cuda.context = options.context;
    cuda.max_batch = options.max_batch;
    cuda.kv_type = options.kv_type;
    cuda.vram_budget = *budget_bytes;
    cuda.log = s.LineLogger("cuda");
    backend = gpu_worker::CreateCudaBackend(*loaded->model, std::move(loaded->plan),
                                            std::move(loaded->partition), cuda);
  }
#endif
  if (!backend.ok()) s.Fail(backend.status());
  absl::Status run = gpu_worker::RunGpuWorker(s, **backend, config);
  if (!run.ok()) s.Fail(run);
  s.SetStopped();
  return 0;
}
