// DINO's teacher as an exponential moving average of the student, one step as VISSL takes it
// after each optimizer step (MomentumTeacherInLossHook.update_momentum_network,
// vissl/hooks/hook_utils.py):
//   for each (student p_s, teacher p_t) in zip(student.parameters(), teacher.parameters()):
//     p_t = p_t · m + (1 − m) · p_s
// Parameters only (BatchNorm running statistics and other buffers stay the teacher's own), all
// of them including those that do not require gradients (DinoHead's fixed weight_g stays 1).
// m comes from dino_teacher_momentum.h.
#pragma once

#include <torch/nn/module.h>

#include <vector>

namespace largo::models {

// Updates `teacher`'s parameters in place, outside autograd, with one multi-tensor multiply
// and one multi-tensor add (at::_foreach_*) per device instead of a loop over parameters; each
// element rounds as VISSL's mul_ then add_ of a product. Throws largo::Error unless the two
// modules have the same number of parameters with the same shapes, dtypes and devices
// (VISSL builds the teacher as a copy of the student's architecture).
void update_dino_teacher(
    torch::nn::Module& teacher, const torch::nn::Module& student, double momentum);

// The same from the student's parameter values given in the teacher's parameter order (the
// whole values gathered where the student's own tensors are shards: momentum_copy_sources).
void update_dino_teacher(
    torch::nn::Module& teacher, const std::vector<at::Tensor>& student, double momentum);

} // namespace largo::models
