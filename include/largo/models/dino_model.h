// The model a DINO run trains (VISSL's dino_loss with its DINOHook): the student (a
// TrunkHeadModel's trunk and dino_head, registered as "trunk" and "head" as MultiCropModel does,
// so its checkpoint initializes a linear evaluation) and the teacher, a second model of the same
// architecture that is not a child module: the optimizer, data parallelism and the model's
// state dict never see it (the loss's checkpoint state carries it, teacher_state_dict).
//
// forward(packed [n, crop 0 | crop 1 | ...], pack_views) in training mode, as VISSL's
// DINOHook.on_forward and the multi-crop forward:
//   1. on the first training forward the teacher's parameters and buffers become copies of the
//      student's (VISSL builds it then and loads the student's state dict into it);
//   2. student = head(trunk(every crop)), consecutive crops of one size in one trunk pass,
//      crop-major rows                                         [num_crops * n, K], with gradient
//   3. teacher = teacher(crops_for_teacher, concatenated), without gradient, in the training
//      mode the student is in (VISSL's teacher is never put in eval mode)   [T * n, K]
//   4. returns [(num_crops + T) * n, K]: student rows, then teacher rows (SelfSupervisedLoss
//      splits them).
// The teacher's EMA update is not part of the forward: VISSL takes it after the optimizer step
// (DINOHook.on_update), which SelfSupervisedLoss::after_optimizer_step calls update_teacher for.
// The teacher is whole on every rank. Where data parallelism shards the student's own tensors
// (FSDP: placements().module_holds_whole_model() is false), build_teacher and update_teacher
// take the student's whole values, gathered by the caller (ParallelModel::full_parameters());
// the first training forward then finds the teacher built. No collectives.
#pragma once

#include <largo/models/module_swap.h>
#include <largo/models/momentum_copy.h>
#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace largo::models {

struct DinoModelOptions {
  std::vector<int64_t> crops_for_teacher{0, 1}; // LOSS.dino_loss.crops_for_teacher
};

class DinoModelImpl : public torch::nn::Module, public SwappableChildren {
 public:
  // `student` is trained; `teacher` must have the same parameter names and shapes (build_model
  // with the same options, drop path 0: its values are replaced on the first forward).
  // `view_shapes`: [channels, h, w] of each crop. Throws ConfigError for fewer than 2 crops or
  // models that differ, OptionError for teacher crops out of range or of different sizes.
  DinoModelImpl(
      const TrunkHeadModel& student,
      TrunkHeadModel teacher,
      std::vector<std::vector<int64_t>> view_shapes,
      DinoModelOptions options = {});

  // packed [n, Σ crop numels] -> [(num_crops + T) * n, K] (student rows | teacher rows).
  at::Tensor forward(const at::Tensor& packed);

  // VISSL's update_momentum_network: p_t = p_t * momentum + (1 - momentum) * p_s over the
  // parameters (update_dino_teacher), p_s from `whole` by name when given, else the student's
  // own tensors. Does nothing before the teacher exists.
  void update_teacher(double momentum, const WholeParameters* whole = nullptr);
  // VISSL's DINOHook._build_momentum_network: the teacher's parameters become copies of the
  // student's (from `whole` by name when given, else the student's own tensors), its buffers
  // of the student's. The first training forward calls it when the teacher is not built yet.
  void build_teacher(const WholeParameters* whole = nullptr);

  const DinoModelOptions& options() const {
    return options_;
  }
  int64_t num_views() const {
    return static_cast<int64_t>(view_shapes_.size());
  }
  const TrunkHeadModel& teacher() const {
    return teacher_;
  }
  bool teacher_built() const {
    return built_;
  }
  // "teacher.<name>" for each of the teacher's parameters and buffers, and
  // "teacher_built" (0 or 1), on the CPU.
  std::map<std::string, at::Tensor> teacher_state_dict() const;
  // Throws CheckpointError for a missing entry or a shape that differs.
  void load_teacher_state_dict(const std::map<std::string, at::Tensor>& state);

  const torch::nn::Sequential& trunk() const {
    return trunk_;
  }
  const torch::nn::Sequential& head() const {
    return head_;
  }
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  void place_teacher(const c10::Device& device);
  at::Tensor student_scores(const std::vector<at::Tensor>& crops);
  at::Tensor teacher_scores(const std::vector<at::Tensor>& crops);

  torch::nn::Sequential trunk_;
  torch::nn::Sequential head_;
  TrunkHeadModel teacher_;
  std::vector<std::vector<int64_t>> view_shapes_;
  DinoModelOptions options_;
  std::optional<c10::Device> teacher_device_; // where place_teacher put it
  bool built_ = false;
};

TORCH_MODULE(DinoModel);

} // namespace largo::models
