// One process's sparsity from the command line: --sparsity (dense, exact, threshold, predicted,
// teal) with the TEAL flags resolved into the FFN's plan and TEAL's, and the executors a
// ForwardPass takes built from them. The workers, generate, logits, perplexity and split_bench
// read the flags through here, so `teal` means the same in each of them.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/sparsity/sparse_ffn.h"
#include "shared/sparsity/sparsity_mode.h"
#include "shared/sparsity/teal.h"
#include "shared/sparsity/teal_profile.h"
#include "shared/util/thread_pool.h"

namespace thermocline {

struct SparsitySetup {
  // The FFN's plan. `--sparsity teal` reads as the dense FFN: TEAL's plan then covers the FFN's
  // projections too, through the executor the dense FFN calls.
  SparsityPlan ffn;
  std::optional<TealPlan> teal;  // nullopt: TEAL off
};

// Reads the statistics, predictors and TEAL profile the flags name (checked against the model's
// shapes). The flags are left as typed, which is what worker processes are given. Errors name
// the flag.
absl::StatusOr<SparsitySetup> SparsitySetupFromFlags(const Model& model, const SparsityFlags& ffn,
                                                     const TealFlags& teal);

// The executors of one process's ForwardPass. Null members are the dense defaults.
struct LocalExecutors {
  std::unique_ptr<SparseFfn> ffn;    // null: the dense FFN
  std::unique_ptr<TealLinear> teal;  // null: every projection dense
};

absl::StatusOr<LocalExecutors> BuildLocalExecutors(const Model& model, SparsitySetup setup,
                                                   ThreadPool& pool,
                                                   const SparseFfnOptions& ffn_options = {});

}  // namespace thermocline
