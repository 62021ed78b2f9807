// The parallel layer's keys -> TrainerOptions::parallel and ::distributed: MODEL.FSDP_CONFIG,
// DISTRIBUTED's pipeline, tensor-parallel and data-parallel settings, MODEL.PIPELINE and
// MODEL.ACTIVATION_CHECKPOINTING. Private to the train layer (parts of
// trainer_options_from_config); each range check names its key.
#pragma once

#include <largo/core/config.h>
#include <largo/train/trainer_options.h>

namespace largo::train {

// DISTRIBUTED's pipeline and tensor-parallel sizes, MODEL.PIPELINE and
// MODEL.ACTIVATION_CHECKPOINTING (with a RegNet's stage_checkpoints groups: read after the
// model's options).
void model_parallel_options_from(const Config& config, TrainerOptions& options);

// VISSL's TRAINER.TASK_NAME, checked (any other task is refused naming the key): its
// self_supervision_task (DDP, or ZeRO-1 beside the ZeRO optimizer), self_supervision_sdp_task
// (FairScale's ShardedDDP: ZeRO-2, only beside the ZeRO optimizer) or
// self_supervision_fsdp_task (FSDP).
enum class VisslTask { kDdp, kShardedDdp, kFsdp };
VisslTask vissl_task(const Config& config);

// Whether the run is FSDP: MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP, or VISSL's FSDP task
// (TRAINER.TASK_NAME self_supervision_fsdp_task), which VISSL's SEER and DINO FSDP configs
// name without AUTO_SETUP_FSDP: the task wraps whatever model is built in FSDP with
// MODEL.FSDP_CONFIG as written (AUTO_SETUP_FSDP sets the task and infers some of its keys).
bool fsdp_requested(const Config& config);

// MODEL.FSDP_CONFIG (ZeRO stage 3, docs/fsdp.md): fsdp_requested turns it on; read after the
// ZeRO keys (the two exclude each other) and MODEL.AMP_PARAMS (FSDP's precision follows it).
void fsdp_options_from(const Config& config, TrainerOptions& options);

// DISTRIBUTED's backend, data-parallel and timeout keys; read after the data-parallel mode is
// chosen (MANUAL_GRADIENT_REDUCTION is refused beside ZeRO-2 and FSDP).
void distributed_options_from(const Config& config, TrainerOptions& options);

} // namespace largo::train
