// Private to the config layer: OPTIMIZER's epochs, parameter groups and the schedules of
// OPTIMIZER.param_schedulers (lr, lr_head, weight_decay, weight_decay_head).
#pragma once

#include <largo/core/config.h>
#include <largo/train/trainer_options.h>

namespace largo::train {

void optimizer_schedule_from(const Config& config, TrainerOptions& options);

} // namespace largo::train
