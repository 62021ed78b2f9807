// The one place where the YAML config tree becomes typed options (STYLE.md rule 3).
// Every range check reports the VISSL key, the value and what is expected; features
// that the config can switch on but this version of Largo does not have yet are
// rejected with a message saying so, instead of being silently ignored.
#pragma once

#include <largo/checkpoint/weights_init.h>
#include <largo/core/config.h>
#include <largo/train/classification_loss.h>
#include <largo/train/model_config.h>
#include <largo/train/trainer_options.h>

namespace largo::train {

TrainerOptions trainer_options_from_config(const Config& config);

// Parts of the above, each validating its keys (ConfigError naming them); MODEL's are in
// model_config.h.

// MODEL.SYNC_BN_CONFIG: parallel::convert_sync_batchnorm with
// parallel::sync_bn_group_size(group_size, NUM_PROC_PER_NODE, world size).
SyncBatchNormSettings sync_batch_norm_settings_from(const Config& config);

// HOOKS.EMA_MODEL (TrainerOptions::model_ema).
ModelEmaSettings model_ema_settings_from(const Config& config);

// LOSS.<name>: ignore_index, and for cross_entropy_multiple_output_single_target temperature,
// normalize_output and weight.
ClassificationLossOptions classification_loss_options_from(const Config& config);

} // namespace largo::train
