// MODEL's trunk, head and feature-evaluation keys -> models::ModelOptions, and
// MODEL.WEIGHTS_INIT for the model they describe. Each range check names its key.
#pragma once

#include <largo/checkpoint/weights_init.h>
#include <largo/core/config.h>
#include <largo/models/model_factory.h>

namespace largo::train {

// MODEL.TRUNK, MODEL.HEAD and MODEL.FEATURE_EVAL_SETTINGS (part of trainer_options_from_config,
// which also refuses unavailable keys first). in_channels, image_size and num_classes are 0:
// the data's.
models::ModelOptions model_options_from(const Config& config);

// MODEL.WEIGHTS_INIT for `model` (its feature evaluation settings decide whether the head is
// loaded; a ResNet gets torchvision's and VISSL's names mapped to Largo's).
checkpoint::WeightsInitOptions
weights_init_options_from(const Config& config, const models::ModelOptions& model);

} // namespace largo::train
