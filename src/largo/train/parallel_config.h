// The parallel layer's keys -> TrainerOptions::parallel and ::distributed: MODEL.FSDP_CONFIG,
// DISTRIBUTED's pipeline, tensor-parallel and data-parallel settings, MODEL.PIPELINE and
// MODEL.ACTIVATION_CHECKPOINTING. Private to the train layer (parts of
// trainer_options_from_config); each range check names its key.
#pragma once

#include <largo/core/config.h>
#include <largo/train/trainer_options.h>

namespace largo::train {

// DISTRIBUTED's pipeline and tensor-parallel sizes, MODEL.PIPELINE and
// MODEL.ACTIVATION_CHECKPOINTING.
void model_parallel_options_from(const Config& config, TrainerOptions& options);

// MODEL.FSDP_CONFIG (ZeRO stage 3, docs/fsdp.md): AUTO_SETUP_FSDP turns it on; read after the
// ZeRO keys (the two exclude each other) and MODEL.AMP_PARAMS (FSDP's precision follows it).
void fsdp_options_from(const Config& config, TrainerOptions& options);

// DISTRIBUTED's backend, data-parallel and timeout keys; read after the data-parallel mode is
// chosen (MANUAL_GRADIENT_REDUCTION is refused beside ZeRO-2 and FSDP).
void distributed_options_from(const Config& config, TrainerOptions& options);

} // namespace largo::train
