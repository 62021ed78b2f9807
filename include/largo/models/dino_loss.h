// DINO's self-distillation loss as VISSL computes it (LOSS.dino_loss, vissl/losses/dino_loss.py,
// with the teacher temperature of vissl/hooks/dino_hooks.py): the teacher's scores for the
// global crops, centred and sharpened, are the targets every other crop of the student predicts:
//   q_i = softmax((t_i - center) / T_teacher(iteration))   for each teacher crop i
//   p_v = log_softmax(s_v / student_temp)                    for each student crop v
//   loss = (1 / n_terms) Σ_{i} Σ_{v != i} mean over images of −Σ_k q_i[k] p_v[k]
// with n_terms the number of (i, v) pairs. As VISSL's loop, crop v is skipped when it has
// teacher crop i's index in the student's crops (not crops_for_teacher[i]): the global crops
// come first in both, so the student's crop i is the teacher's crop i. The targets carry no
// gradient.
// After the loss, the center moves towards the mean of the teacher's raw scores over every
// image of every rank (one all-reduce over `group`):
//   center = center · center_momentum + Σ_ranks Σ_rows t / (rows · world) · (1 − center_momentum)
// Each rank's loss is over its own images; data parallelism averages the gradients.
#pragma once

#include <largo/comm/process_group.h>

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace largo::models {

// VISSL's dino_loss keys, with its defaults (defaults.yaml).
struct DinoLossOptions {
  double student_temp = 0.1;                    // > 0
  double teacher_temp_min = 0.04;               // the teacher temperature at iteration 0, > 0
  double teacher_temp_max = 0.07;               // ... from teacher_temp_warmup_iters - 1 on, > 0
  int64_t teacher_temp_warmup_iters = 37500;    // >= 0
  double center_momentum = 0.9;                 // VISSL's ema_center, in [0, 1]
  int64_t num_crops = 2;                        // crops per image in the student's output, >= 2
  std::vector<int64_t> crops_for_teacher{0, 1}; // the crops the teacher sees, non-empty
  int64_t output_dim = 65536;                   // the head's output width (the center's), > 0
};

// Throws OptionError naming the DinoLossOptions field of the first bad value.
void validate_dino_loss_options(const DinoLossOptions& options);

// The teacher temperature at `iteration` (0-based), as DINOHook.update_teacher_temperature
// takes it: torch.linspace(min, max, warmup_iters) in float32 for the first warmup_iters
// iterations (so the last of them is already max), then max. Returned as that float32 value.
double dino_teacher_temperature(const DinoLossOptions& options, int64_t iteration);

class DinoLoss {
 public:
  explicit DinoLoss(DinoLossOptions options); // validates; the center starts at 0

  // `student` [num_crops * n, output_dim]: this rank's student scores, crop-major (crop 0 of
  // every image, then crop 1...: VISSL's multicrop_collator order). `teacher`
  // [crops_for_teacher.size() * n, output_dim]: the teacher's scores for those crops, the same
  // order. Returns the loss (a scalar with the student's dtype) and updates the center.
  // Collective over `group`; throws largo::Error for shapes that do not fit.
  at::Tensor forward(
      const at::Tensor& student,
      const at::Tensor& teacher,
      int64_t iteration,
      comm::ProcessGroup& group);

  const at::Tensor& center() const { // [1, output_dim], float32
    return center_;
  }
  // VISSL's loss state besides its teacher: {"center": [1, output_dim]}.
  std::map<std::string, at::Tensor> state_dict() const;
  // Throws CheckpointError for a missing center or one of another shape.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);
  const DinoLossOptions& options() const {
    return options_;
  }

 private:
  void update_center(const at::Tensor& teacher, comm::ProcessGroup& group);

  DinoLossOptions options_;
  // dino_teacher_temperature's warm-up, built once (VISSL's hook keeps it too): one float32
  // per warm-up iteration, tens of thousands in VISSL's configs.
  at::Tensor teacher_temperatures_;
  at::Tensor center_;
};

} // namespace largo::models
