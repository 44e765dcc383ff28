// The command-line face of SparsityFlags, for every program that runs a sparsity plan
// (`generate`, `perplexity`, `logits`, the gateway, both workers): one list of the flags and
// their help. VisitSparsityFields is that list; AddSparsityOptions registers it for parsing and
// the split driver emits the workers' flags from it (shared/ipc/worker_flags.h).
// Header-only because only programs (which link Boost.Program_options) call AddSparsityOptions.
#pragma once

#include <boost/program_options.hpp>

#include "shared/sparsity/sparsity_mode.h"
#include "shared/util/flag_options.h"

namespace thermocline {

// Calls v(name, help, field...) for each flag, with the same member of every struct in `flags`
// (one struct to register or emit, two to compare). The order is the order flags are emitted.
template <class V, class... Flags>
void VisitSparsityFields(V&& v, Flags&... flags) {
  v("sparsity", "FFN sparsity: dense, exact, threshold or predicted", flags.mode...);
  v("stats", "activation statistics from `thermocline profile` (threshold cuts)",
    flags.stats_path...);
  v("target-sparsity",
    "which of the profiled cuts to use, e.g. 0.5 (threshold: the share of down rows skipped)",
    flags.target_sparsity...);
  v("gate-sparsity",
    "threshold: share of up rows skipped by the gate cut (a profiled target <= the target "
    "sparsity; default 0.2, 0 = none)",
    flags.gate_sparsity...);
  v("predictor",
    "predictors from `thermocline train-predictor` (predicted; default: the model's own)",
    flags.predictor_path...);
}

// The values are written into `flags` at po::notify; `flags` must outlive it.
inline void AddSparsityOptions(boost::program_options::options_description& opts,
                               SparsityFlags& flags) {
  VisitSparsityFields(
      [&opts](const char* name, const char* help, auto& value) {
        AddFlagOption(opts, name, help, value);
      },
      flags);
}

}  // namespace thermocline
