// The command-line face of TealFlags (teal_profile.h) for the programs that run a forward pass
// (`perplexity`, `generate`, `logits`, the benchmarks). Header-only because only programs link
// Boost.Program_options.
#pragma once

#include <boost/program_options.hpp>

#include "shared/sparsity/teal_profile.h"
#include "shared/util/flag_options.h"

namespace thermocline {

inline void AddTealOptions(boost::program_options::options_description& opts, TealFlags& flags) {
  AddFlagOption(opts, "teal-sparsity",
                "TEAL (--sparsity teal, or with exact/threshold/predicted for attention): the "
                "model-level input sparsity, e.g. 0.5 (a --teal-profile target; without a "
                "profile, the share of each projection's inputs dropped per token)",
                flags.sparsity);
  AddFlagOption(opts, "teal-profile",
                "TEAL's calibrated per-projection cuts from `thermocline teal-calibrate`",
                flags.profile_path);
}

}  // namespace thermocline
