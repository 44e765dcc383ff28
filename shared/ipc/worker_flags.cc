#include "shared/ipc/worker_flags.h"

#include "shared/util/status_macros.h"

namespace thermocline::ipc {

absl::StatusOr<WorkerModel> LoadWorkerModel(const CommonWorkerFlags& flags) {
  WorkerModel w;
  TC_ASSIGN_OR_RETURN(w.model, Model::Load(flags.model_path));
  TC_ASSIGN_OR_RETURN(w.plan, SparsityPlanFromFlags(*w.model, flags.sparsity));
  TC_ASSIGN_OR_RETURN(w.placement, PlacementFromFlags(w.model->config(), flags.placement));
  TC_ASSIGN_OR_RETURN(w.partition, Partition::FromPlacement(w.placement, w.model->config()));
  return w;
}

}  // namespace thermocline::ipc
