// The training loop of the `largo` program, built only from the library's public parts:
//   resolve the config (run_plan.h) -> data (training_data.h) -> model (models/) ->
//   parallel::parallelize() -> TrainStep over and over, with hooks for logging, evaluation
//   and checkpoints (training_hooks.h) and the run's state in a checkpoint::TrainingState.
// It never asks which parallel mode is on.
//
// Run directory (CHECKPOINT.DIR): train_config.yaml (the effective config),
// metrics.jsonl, tb_logs/ (TensorBoard), model_iteration{N}.torch / model_phase{E}.torch
// / model_final_checkpoint_phase{E}.torch, and checkpoint.torch, a symlink to the latest
// complete checkpoint. With auto_resume the run continues from checkpoint.torch; on CPU a
// resumed run is bit-identical to an uninterrupted one (data order, augmentation and
// dropout are functions of the seed, the epoch and the position, all restored).
//
// Data parallel: every rank of the process group runs a Trainer; each reads its own share
// of every epoch, and evaluation runs on every rank over a split of the test set with the
// counts summed. Rank 0 alone logs, writes metrics, TensorBoard and checkpoints (with every
// rank's RNG state; ZeRO: every rank writes its optimizer shard). run() is collective.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/models/trunk_head_model.h>
#include <largo/train/run_plan.h>
#include <largo/train/trainer_options.h>

#include <map>
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
  // With TrainerOptions::record_samples_read: this rank's training samples (dataset indices)
  // read by this run's steps, in order, by epoch.
  std::map<int64_t, std::vector<int64_t>> samples_read;
};

class Trainer {
 public:
  // `effective_config_yaml` is written to the run directory as train_config.yaml
  // (empty: not written). Builds data, model and optimizer; throws on any problem.
  // Without a `group`, the launcher's environment decides (comm/world_info.h): a process
  // group over RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (or SLURM / Open MPI's variables), or
  // a single process when none are set.
  explicit Trainer(TrainerOptions options, std::string effective_config_yaml = "",
                   std::shared_ptr<comm::ProcessGroup> group = nullptr);
  // The same from a resolved run (`largo train`: resolve_run(config)).
  explicit Trainer(RunPlan plan, std::string effective_config_yaml = "",
                   std::shared_ptr<comm::ProcessGroup> group = nullptr);
  ~Trainer();

  TrainSummary run();

  // The model. Under FSDP (MODEL.FSDP_CONFIG) its trainable parameters hold no memory
  // between steps, and with a pipeline only this rank's stages keep their tensors (the
  // others' are emptied): read them through full_parameters(). In a linear evaluation
  // (MODEL.FEATURE_EVAL_SETTINGS) it is the model whose frozen trunk the evaluation's heads
  // train on (models::LinearEvalModel); full_parameters() has the heads.
  models::TrunkHeadModel& model();

  // Every parameter's value by name (copies). Collective under FSDP, which gathers the
  // units one at a time, and with a pipeline, whose rank 0 gathers the stages (the other
  // ranks get their stages' parameters).
  std::map<std::string, at::Tensor> full_parameters();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

} // namespace largo::train
