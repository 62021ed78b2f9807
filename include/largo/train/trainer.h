// The training loop: data → model → loss → backward → optimizer step → LR schedule,
// with evaluation, logging (console, metrics.jsonl, TensorBoard) and checkpoints.
//
// Run directory (CHECKPOINT.DIR): train_config.yaml (the effective config),
// metrics.jsonl, tb_logs/ (TensorBoard), model_iteration{N}.torch / model_phase{E}.torch
// / model_final_checkpoint_phase{E}.torch, and checkpoint.torch, a symlink to the latest
// complete checkpoint. With auto_resume the run continues from checkpoint.torch; on CPU a
// resumed run is bit-identical to an uninterrupted one (data order, augmentation and
// dropout are functions of the seed, the epoch and the position, all restored).
#pragma once

#include <largo/models/trunk_head_model.h>
#include <largo/train/trainer_options.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace largo::train {

struct TrainSummary {
  int64_t epochs_completed = 0;
  int64_t iterations = 0; // global iteration count at the end
  std::optional<double> final_top1; // last evaluation, percent
  std::optional<double> final_top5;
  std::vector<float> iteration_losses; // the losses of the iterations this run executed
  bool resumed = false; // started from a checkpoint
  bool interrupted = false; // stopped by stop_after_iterations
  bool already_complete = false; // a final checkpoint existed; nothing was trained
};

class Trainer {
 public:
  // `effective_config_yaml` is written to the run directory as train_config.yaml
  // (empty: not written). Builds data, model and optimizer; throws on any problem.
  explicit Trainer(TrainerOptions options, std::string effective_config_yaml = "");
  ~Trainer();

  TrainSummary run();

  models::TrunkHeadModel& model();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

} // namespace largo::train
