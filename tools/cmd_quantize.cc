// `thermocline quantize IN.gguf OUT.gguf --type T [--pure]`: llama-quantize's per-tensor rules
// (shared/model/quantize.h) for the types Thermocline can write.
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "shared/gguf/gguf.h"
#include "shared/model/quantize.h"
#include "shared/util/load_average.h"
#include "shared/util/progress.h"
#include "shared/util/thread_pool.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

int RunQuantize(const std::vector<std::string>& args) {
  std::string type_name;
  std::vector<std::string> files;
  bool pure = false;
  int threads = 0;
  po::options_description opts("options");
  opts.add_options()(
      "type", po::value(&type_name)->required(),
      "llama-quantize type: Q8_0, Q6_K, Q5_K_M (alias Q5_K), Q5_K_S, Q5_1, Q5_0, Q4_K_M "
      "(alias Q4_K), Q4_K_S, Q4_1, Q4_0, Q3_K_L, Q3_K_M (alias Q3_K), Q3_K_S, Q2_K, Q2_K_S, "
      "IQ4_NL, IQ4_XS, F16, BF16 or F32 (the grid i-quants IQ3_*, IQ2_*, IQ1_* and TQ*_0 are "
      "refused: their quantizers are not written yet)")(
      "pure", po::bool_switch(&pure), "every weight matrix in --type (no per-tensor mix)")(
      "threads", po::value(&threads)->default_value(0),
      "CPU threads that quantize a tensor's rows (0 = all cores; the bytes written are the same "
      "for any number)")("files", po::value(&files)->composing(), "IN.gguf OUT.gguf");
  po::positional_options_description pos;
  pos.add("files", -1);
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("quantize", "IN.gguf OUT.gguf --type T [--pure] [--threads N]", opts, pos, args,
                    vm, exit_code)) {
    return exit_code;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "thermocline quantize: " << msg << "\n";
    return 1;
  };
  if (threads < 0) return fail(absl::StrFormat("--threads must be 0 or more, got %d", threads));
  if (files.size() != 2) {
    return fail(absl::StrFormat("expected IN.gguf and OUT.gguf, got %d files", files.size()));
  }
  absl::StatusOr<QuantizeTarget> target = QuantizeTargetFromName(type_name);
  if (!target.ok()) return fail(std::string(target.status().message()));
  absl::StatusOr<std::unique_ptr<GgufFile>> in = GgufFile::Open(files[0]);
  if (!in.ok()) return fail(std::string(in.status().message()));
  QuantizeOptions options{*target, pure};
  absl::StatusOr<std::vector<QuantizedTensor>> plan = PlanQuantization(**in, options);
  if (!plan.ok()) return fail(std::string(plan.status().message()));
  // Progress in MiB of the source: quantizing takes time in proportion to the bytes.
  int64_t source_bytes = 0;
  for (const GgufTensorInfo& t : (*in)->tensors()) source_bytes += t.n_bytes;
  constexpr int64_t kMiB = 1 << 20;
  ThreadPool pool(threads > 0 ? threads : UsableCpus());
  ProgressBar bar("quantize", (source_bytes + kMiB - 1) / kMiB, "MiB");
  absl::Status st = QuantizeModel(**in, files[1], options, pool,
                                  [&](int64_t done, int64_t) { bar.Update(done / kMiB); });
  if (!st.ok()) return fail(std::string(st.message()));
  bar.Finish();
  std::map<std::string, int> counts;
  for (const QuantizedTensor& q : *plan) ++counts[std::string(TypeTraits(q.to).name)];
  std::string summary;
  for (const auto& [name, n] : counts) {
    summary += absl::StrFormat("%s%s: %d", summary.empty() ? "" : ", ", name, n);
  }
  std::cout << absl::StrFormat("wrote %s: %s%s, %d tensors (%s)\n", files[1], target->name,
                               pure ? " --pure" : "", plan->size(), summary);
  return 0;
}

static CommandRegistrar registrar(
    {"quantize", "re-store a model's matrices in another type (llama-quantize's rules)",
     &RunQuantize});

}  // namespace
}  // namespace thermocline::tools
