// The momentum of DINO's teacher update at one iteration, as VISSL's DINOHook computes it
// (MomentumTeacherInLossHook.update_momentum_network with_cosine_schedule,
// vissl/hooks/hook_utils.py): a cosine from `base` at iteration 0 to 1 at max_iteration,
//   m = 1 − 0.5 · (1 − base) · (cos(π · iteration / max_iteration) + 1),
// evaluated in double in the same order as VISSL's Python, so the values are its own. VISSL
// calls it after each optimizer step with the 0-based iteration of that step (the counter
// moves on after the step's hooks). base is LOSS.dino_loss.momentum (0.996).
#pragma once

#include <cstdint>

namespace largo::models {

// Throws OptionError for a base outside [0, 1], max_iteration <= 0 or a negative iteration.
double dino_teacher_momentum(double base, int64_t iteration, int64_t max_iteration);

} // namespace largo::models
