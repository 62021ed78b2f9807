// What a self-supervised method keeps on each rank beside the model state that the ZeRO
// estimate counts (parallel/estimate/): DINO's teacher and MoCo's momentum encoder (whole
// copies of the trained model's parameters and buffers, without gradients or optimizer state,
// whole on every rank whatever the data parallelism: models/dino_model.h, moco_model.h),
// MoCo's queue of keys and SwAV's queue, each sized from the built model and the loss options
// as the trainer builds them. DeepCluster v2's memory banks hold a row per image a rank reads
// in an epoch, which only the dataset knows: listed without bytes. `largo estimate` prints
// them. No collectives.
#pragma once

#include <largo/models/model_factory.h>
#include <largo/train/run_plan.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace largo::train {

struct MethodState {
  std::string what;             // "DINO teacher (a whole copy of the student: ...)"
  std::optional<int64_t> bytes; // per rank; nullopt: sized by the dataset (see `what`)
};

// The method state of `plan`'s run on one rank, `model` being build_run_model(plan.model);
// empty for a run without such state (supervised, SimCLR, Barlow Twins, SwAV without a queue).
std::vector<MethodState> estimate_method_state(const RunPlan& plan, const models::RunModel& model);

} // namespace largo::train
