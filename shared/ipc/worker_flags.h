// The command line both worker processes share (docs/workers.md): --instance, --model,
// --threads, the placement (--plan or --hot-fraction, ordered by --stats) and the sparsity
// flags of SparsityPlanFromFlags, plus loading what they name. Given the same flags, both
// workers compute the same Placement and SparsityPlan, which is what lets them split every
// layer's neurons without telling each other which neuron lives where.
#pragma once

#include <boost/program_options.hpp>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/placement.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/sparsity_options.h"

namespace thermocline::ipc {

struct CommonWorkerFlags {
  std::string instance;
  std::string model_path;
  int threads = 1;
  PlacementFlags placement;
  SparsityFlags sparsity;
  // Raw values of the optional flags, moved into the structs above by FinishCommonWorkerFlags.
  double hot_fraction = 0;
  SparsityOptionValues sparsity_values;
};

inline void AddCommonWorkerOptions(boost::program_options::options_description& opts,
                                   CommonWorkerFlags& f) {
  namespace po = boost::program_options;
  opts.add_options()
      ("help", "show this help")
      ("instance", po::value(&f.instance)->required(), "transport instance to attach to")
      ("model", po::value(&f.model_path)->required(), "model file (GGUF)")
      ("threads", po::value(&f.threads)->default_value(1), "compute threads (>= 1)")
      ("plan", po::value(&f.placement.plan_path), "placement (.gpuidx) from `thermocline plan`")
      ("hot-fraction", po::value(&f.hot_fraction), "or: share of each layer's neurons that is hot, in [0, 1] (hottest first by --stats when given)");
  AddSparsityOptions(opts, f.sparsity, f.sparsity_values);
}

// Parses argv; on --help prints usage to stdout and sets exit_code 0; on a bad flag prints the
// error to stderr and sets exit_code 2. Returns true when the worker should go on.
inline bool ParseWorkerCommandLine(const char* program, const char* prefix,
                                   const boost::program_options::options_description& opts,
                                   int argc, char** argv, CommonWorkerFlags& f, int& exit_code) {
  namespace po = boost::program_options;
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("help")) {
      std::cout << "usage: " << program << " --instance NAME --model M.gguf "
                << "(--plan PLAN.gguf | --hot-fraction F) [options]\n"
                << opts << "\n";
      exit_code = 0;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << prefix << ": " << e.what() << "\n" << opts << "\n";
    exit_code = 2;
    return false;
  }
  if (vm.count("hot-fraction")) f.placement.hot_fraction = f.hot_fraction;
  FinishSparsityOptions(vm, f.sparsity_values, f.sparsity);
  f.placement.stats_path = f.sparsity.stats_path;
  // Checked before attaching, so a bad command line fails at once.
  if (f.placement.plan_path.empty() == !f.placement.hot_fraction.has_value()) {
    std::cerr << prefix << ": give exactly one of --plan PLAN.gguf and --hot-fraction F\n";
    exit_code = 2;
    return false;
  }
  if (f.threads < 1) {
    std::cerr << prefix << ": --threads must be >= 1\n";
    exit_code = 2;
    return false;
  }
  return true;
}

// What both workers load from the common flags.
struct WorkerModel {
  std::unique_ptr<Model> model;
  SparsityPlan plan;
  Placement placement;
  Partition partition;
};
absl::StatusOr<WorkerModel> LoadWorkerModel(const CommonWorkerFlags& flags);

}  // namespace thermocline::ipc
