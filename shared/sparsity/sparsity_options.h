// The command-line face of SparsityFlags, for every program that runs a sparsity plan
// (`generate`, `perplexity`, both workers): one definition of the flags and their help.
// Header-only because only programs (which link Boost.Program_options) include it.
#pragma once

#include <boost/program_options.hpp>

#include "shared/sparsity/sparsity_mode.h"

namespace thermocline {

// Holds the optional values until FinishSparsityOptions moves the given ones into the flags.
struct SparsityOptionValues {
  float target_sparsity = 0;
  float gate_sparsity = 0;
};

inline void AddSparsityOptions(boost::program_options::options_description& opts,
                               SparsityFlags& flags, SparsityOptionValues& values) {
  namespace po = boost::program_options;
  // clang-format off
  opts.add_options()
      ("sparsity", po::value(&flags.mode)->default_value("dense"),
       "FFN sparsity: dense, exact, threshold or predicted")
      ("stats", po::value(&flags.stats_path),
       "activation statistics from `thermocline profile` (threshold cuts)")
      ("target-sparsity", po::value(&values.target_sparsity),
       "which of the profiled cuts to use, e.g. 0.5 (threshold: the share of down rows skipped)")
      ("gate-sparsity", po::value(&values.gate_sparsity),
       "threshold: share of up rows skipped by the gate cut (a profiled target <= the target "
       "sparsity; default 0.2, 0 = none)")
      ("predictor", po::value(&flags.predictor_path),
       "predictors from `thermocline train-predictor` (predicted; default: the model's own)");
  // clang-format on
}

inline void FinishSparsityOptions(const boost::program_options::variables_map& vm,
                                  const SparsityOptionValues& values, SparsityFlags& flags) {
  if (vm.count("target-sparsity")) flags.target_sparsity = values.target_sparsity;
  if (vm.count("gate-sparsity")) flags.gate_sparsity = values.gate_sparsity;
}

}  // namespace thermocline
