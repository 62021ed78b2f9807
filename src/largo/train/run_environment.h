// Where this process runs: its process group (the launcher's world, or one process), the
// world as resolve_run sees it, the intra-op threads and the device. Private to the trainer.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/train/run_plan.h>
#include <largo/train/trainer_options.h>

#include <torch/torch.h>

#include <memory>
#include <string>

namespace largo::train {

// The process group of this run: one from the launcher's environment, or a single process.
std::shared_ptr<comm::ProcessGroup>
join_world(const DistributedOptions& options, const std::string& backend);

RunWorld world_of(const comm::ProcessGroup& group);

// Intra-op threads: MACHINE.NUM_THREADS, or (0) every core shared among the ranks on this
// machine, so that N workers on one node do not oversubscribe it N times. Returns the count.
int64_t set_threads(int64_t configured, int procs_per_node);

// The process-wide kernel switches of the run's options: TF32 (MACHINE.ALLOW_TF32_MATMUL /
// _CUDNN) and the attention backend tried first (MACHINE.ATTENTION_BACKEND).
void apply_kernel_switches(const TrainerOptions& options);

// MACHINE.DEVICE: the CPU, or the GPU the launcher's LOCAL_RANK picks (the CPU, with a
// warning, when no CUDA device is visible).
torch::Device pick_device(const TrainerOptions& options);

} // namespace largo::train
