// thermocline-gpu-worker: the dense half of a split model (docs/workers.md). Attaches to an
// instance's transport, loads the model with its placement and sparsity plan, and serves Steps
// from the gateway, exchanging every layer's cold neurons with the CPU worker.
#include <string>

#include "absl/strings/str_cat.h"
#include "gpu_worker/host/host_backend.h"
#include "gpu_worker/worker_loop.h"
#include "shared/ipc/worker_flags.h"
#include "shared/ipc/worker_session.h"

namespace po = boost::program_options;
using namespace thermocline;

int main(int argc, char** argv) {
  ipc::CommonWorkerFlags common;
  std::string backend_name, kv_type;
  gpu_worker::HostBackendOptions options;
  po::options_description opts("thermocline-gpu-worker options");
  ipc::AddCommonWorkerOptions(opts, common);
  opts.add_options()
      ("backend", po::value(&backend_name)->default_value("host"), "compute backend: host")
      ("kv-slots", po::value(&options.n_kv_slots)->default_value(4), "KV cache slots (sequences)")
      ("context", po::value(&options.context)->default_value(0), "positions per slot (0 = the model's context length)")
      ("max-batch", po::value(&options.max_batch)->default_value(512), "most entries in one Step")
      ("kv-type", po::value(&kv_type)->default_value("f32"), "KV cache element type: f32 or f16");
  int exit_code = 0;
  if (!ipc::ParseWorkerCommandLine("thermocline-gpu-worker", "gpu_worker", opts, argc, argv,
                                   common, exit_code)) {
    return exit_code;
  }
  auto usage_error = [](const std::string& msg) {
    std::fprintf(stderr, "gpu_worker: %s\n", msg.c_str());
    return 2;
  };
  if (backend_name != "host") {
    return usage_error("--backend " + backend_name + " is not available; the only backend is host");
  }
  if (kv_type != "f32" && kv_type != "f16") return usage_error("--kv-type must be f32 or f16");
  if (options.context < 0) return usage_error("--context must be >= 0");
  options.kv_type = kv_type == "f16" ? GgmlType::kF16 : GgmlType::kF32;
  options.threads = common.threads;

  auto session = ipc::WorkerSession::Start("gpu_worker", common.instance, ipc::Role::kGpuWorker);
  if (!session.ok()) {
    std::fprintf(stderr, "gpu_worker: cannot attach to instance '%s': %s\n",
                 common.instance.c_str(), session.status().ToString().c_str());
    return 1;
  }
  ipc::WorkerSession& s = **session;
  s.Log(absl::StrCat("attached to instance '", common.instance, "' (pid ", getpid(), ")"));
  auto loaded = ipc::LoadWorkerModel(common);
  if (!loaded.ok()) s.Fail(loaded.status());
  const LlamaConfig& config = loaded->model->config();
  int64_t hot = 0;
  for (const LayerPartition& l : loaded->partition.layers) hot += static_cast<int64_t>(l.hot.size());
  s.Log(absl::StrCat("loaded ", common.model_path, ": ", config.n_layers, " layers, ", hot, " of ",
                     config.n_layers * config.ffn_dim, " FFN neurons hot, sparsity ",
                     common.sparsity.mode, ", ", common.threads, " threads"));
  auto backend = gpu_worker::HostBackend::Create(*loaded->model, std::move(loaded->plan),
                                                 std::move(loaded->partition), options);
  if (!backend.ok()) s.Fail(backend.status());
  absl::Status run = gpu_worker::RunGpuWorker(s, **backend, config);
  if (!run.ok()) s.Fail(run);
  s.SetStopped();
  return 0;
}
