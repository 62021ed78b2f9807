// The one place where the YAML config tree becomes typed options (STYLE.md rule 3).
// Every range check reports the VISSL key, the value and what is expected; features
// that the config can switch on but this version of Largo does not have yet are
// rejected with a message saying so, instead of being silently ignored.
#pragma once

#include <largo/checkpoint/weights_init.h>
#include <largo/core/config.h>
#include <largo/train/classification_loss.h>
#include <largo/train/trainer_options.h>

namespace largo::train {

TrainerOptions trainer_options_from_config(const Config& config);

// MODEL.TRUNK, MODEL.HEAD and MODEL.FEATURE_EVAL_SETTINGS (part of the above, which also
// refuses unavailable keys first). in_channels, image_size and num_classes are 0: the data's.
models::ModelOptions model_options_from(const Config& config);

// Parts of the above, each validating its keys (ConfigError naming them).
// MODEL.FEATURE_EVAL_SETTINGS is read into TrainerOptions::model.feature_eval, though the
// trainer does not use it yet (its keys stay in train/unavailable_keys.h until it does).

// MODEL.SYNC_BN_CONFIG: parallel::convert_sync_batchnorm with
// parallel::sync_bn_group_size(group_size, NUM_PROC_PER_NODE, world size).
SyncBatchNormSettings sync_batch_norm_settings_from(const Config& config);

// HOOKS.EMA_MODEL (TrainerOptions::model_ema).
ModelEmaSettings model_ema_settings_from(const Config& config);

// MODEL.WEIGHTS_INIT for `model` (its feature evaluation settings decide whether the head is
// loaded; a ResNet gets torchvision's and VISSL's names mapped to Largo's).
checkpoint::WeightsInitOptions
weights_init_options_from(const Config& config, const models::ModelOptions& model);

// LOSS.<name>: ignore_index, and for cross_entropy_multiple_output_single_target temperature,
// normalize_output and weight.
ClassificationLossOptions classification_loss_options_from(const Config& config);

} // namespace largo::train
