#include "shared/sparsity/sparsity_setup.h"

#include <utility>

#include "shared/util/status_macros.h"

namespace thermocline {

absl::StatusOr<SparsitySetup> SparsitySetupFromFlags(const Model& model, const SparsityFlags& ffn,
                                                     const TealFlags& teal) {
  SparsitySetup setup;
  TC_ASSIGN_OR_RETURN(setup.teal, TealPlanFromFlags(model, ffn.mode, teal));
  SparsityFlags ffn_flags = ffn;
  if (ffn.mode == "teal") ffn_flags.mode = "dense";
  TC_ASSIGN_OR_RETURN(setup.ffn, SparsityPlanFromFlags(model, ffn_flags));
  return setup;
}

absl::StatusOr<LocalExecutors> BuildLocalExecutors(const Model& model, SparsitySetup setup,
                                                   ThreadPool& pool,
                                                   const SparseFfnOptions& ffn_options) {
  LocalExecutors e;
  if (!setup.ffn.AllDense()) {
    TC_ASSIGN_OR_RETURN(e.ffn, SparseFfn::Create(model, std::move(setup.ffn), pool, ffn_options));
  }
  if (setup.teal) {
    TC_ASSIGN_OR_RETURN(e.teal, TealLinear::Create(model, std::move(*setup.teal), pool));
  }
  return e;
}

}  // namespace thermocline
