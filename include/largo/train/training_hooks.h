// What the training loop calls around its steps and epochs: logging (console line, progress
// bar, metrics.jsonl, TensorBoard), evaluation and checkpoint cadence, each a hook, so that
// the loop itself is zero_grad -> micro-steps -> step over and over (trainer.h).
//
// Hooks run on every rank in the order given; those that issue collectives (logging's
// all-reduce at its log iterations, evaluation, checkpoints) do so at the same iterations on
// every rank. Rank 0 alone prints and writes files.
#pragma once

#include <largo/checkpoint/training_state.h>
#include <largo/core/memory_tracker.h>
#include <largo/optim/model_ema.h>
#include <largo/train/evaluator.h>
#include <largo/train/metrics_writer.h>
#include <largo/train/progress_bar.h>
#include <largo/train/tensorboard_writer.h>
#include <largo/train/train_step.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace largo::train {

// After an optimizer step: where the run stands (already advanced past the step) and what the
// step did on this rank. Without a sync every step (TrainStepOptions::sync_every_step) the
// steps' losses are read only where the trainer reads them (TrainingHook::reads_results_after,
// an epoch's end): steps_read holds the steps read at this one, oldest first, this step last;
// with a sync, this step alone.
struct StepEvent {
  const checkpoint::TrainingProgress& progress;
  const StepResult& step; // num_images; loss and finite once read (in steps_read)
  const std::vector<StepResult>& steps_read;
  double lr = 0.0;                        // the first group's learning rate of the step
  std::optional<int64_t> step_peak_bytes; // measured with activation checkpointing
  std::optional<double> weight_decay;     // the decayed groups', when a schedule sets it
};

class TrainingHook {
 public:
  virtual ~TrainingHook();
  virtual void on_step_end(const StepEvent& event) {}
  // Whether this hook needs the steps' losses read after the step that brought the run to
  // `progress` (a log line, a checkpoint: the run stops at a diverged step before writing).
  // The trainer also reads them at every epoch's end.
  virtual bool reads_results_after(const checkpoint::TrainingProgress& progress) const {
    return false;
  }
  // After the last step of an epoch, with the progress moved on to the next epoch
  // (progress.epoch is the number of epochs done; complete after the last one).
  virtual void on_epoch_end(checkpoint::TrainingProgress& progress) {}
};

// Rank 0's records of a run, shared by the hooks: metrics.jsonl, TensorBoard (tb_logs/) and
// the console's progress bar (cleared before any other line is printed).
struct RunRecords {
  std::unique_ptr<MetricsWriter> metrics;         // null on other ranks
  std::unique_ptr<TensorBoardWriter> tensorboard; // null unless HOOKS.TENSORBOARD_SETUP
  ProgressBar progress_bar;
};

// The console line, progress bar, metrics.jsonl and TensorBoard scalars every LOG_FREQUENCY
// iterations and at the end of each epoch: the mean loss and the images/s of every rank (an
// all-reduce), the learning rate, the loss scale with skipped steps, the ETA, and this rank's
// loader (images/s it can build, the share of the time the step waited for data, bad
// samples skipped), so a step starved by data is visible. Given the model's training FLOPs
// per sample (models/flop_count.h; 0: unknown, not printed), also the achieved model FLOP/s:
// that count times the images/s of all ranks; and given the run's peak (all ranks' devices,
// train/run_peak_flops.h; 0: not printed), the model FLOP utilisation, FLOP/s / peak.
class LoggingHook : public TrainingHook {
 public:
  LoggingHook(
      parallel::ParallelModel& model,
      const data::DataLoader& loader,
      RunRecords& records,
      int64_t log_frequency,
      int64_t training_flops_per_sample = 0,
      double peak_flops_per_sec = 0.0);
  void on_step_end(const StepEvent& event) override;
  void on_epoch_end(checkpoint::TrainingProgress& progress) override;
  bool reads_results_after(const checkpoint::TrainingProgress& progress) const override;

 private:
  void log_window(const StepEvent& event);
  void write_records(const nlohmann::json& record, int64_t iteration);

  parallel::ParallelModel& model_;
  const data::DataLoader& loader_;
  data::LoaderStats last_loader_stats_; // at the previous log line of this epoch
  RunRecords& records_;
  int64_t log_frequency_;
  int64_t training_flops_per_sample_;
  double peak_flops_per_sec_;
  std::chrono::steady_clock::time_point window_start_ = std::chrono::steady_clock::now();
  int64_t window_images_ = 0;
  double window_loss_ = 0.0;
  int64_t window_steps_ = 0;    // whose losses window_loss_ sums
  float last_loss_read_ = 0.0f; // the progress bar's
  int64_t window_peak_bytes_ = 0;
};

// Evaluation on the test split every TEST_EVERY_NUM_EPOCH epochs and after the last one
// (TEST_MODEL); the result goes to the console, metrics.jsonl, TensorBoard and the progress
// (top1, top5, best_top1, which checkpoints keep). `on_new_best` runs on every rank (it may
// gather the model) after an evaluation whose top-1 beats every earlier one of the run:
// training writes model_best.torch there.
class EvaluationHook : public TrainingHook {
 public:
  using NewBestCallback = std::function<void(const checkpoint::TrainingProgress&)>;
  EvaluationHook(
      parallel::ParallelModel& model,
      TrainingData& data,
      torch::Device device,
      EvaluationOptions options,
      int64_t every_num_epochs,
      RunRecords& records,
      NewBestCallback on_new_best = {});
  void on_epoch_end(checkpoint::TrainingProgress& progress) override;
  // Evaluates now (collective) and records the result in `progress` and the run's records:
  // what on_epoch_end does every TEST_EVERY_NUM_EPOCH epochs, and a TEST_ONLY run once.
  void report(checkpoint::TrainingProgress& progress);
  // HOOKS.EMA_MODEL.ENABLE_EMA_METERS: each evaluation also evaluates `ema`'s average, put
  // into `model_tensors` (the module's, by name) for it and their own values back after,
  // bit for bit; recorded as phase "test_ema". Both outlive this hook.
  void also_evaluate(const optim::ModelEma& ema, optim::NamedTensors model_tensors);

 private:
  EvaluationResult evaluate_average();
  void record(
      const EvaluationResult& result,
      const checkpoint::TrainingProgress& progress,
      const std::string& phase);

  parallel::ParallelModel& model_;
  TrainingData& data_;
  torch::Device device_;
  EvaluationOptions options_;
  int64_t every_num_epochs_;
  RunRecords& records_;
  NewBestCallback on_new_best_;
  const optim::ModelEma* ema_ = nullptr;
  optim::NamedTensors ema_tensors_;
};

// Checkpoints every CHECKPOINT_ITER_FREQUENCY iterations inside an epoch, every
// CHECKPOINT_FREQUENCY epochs, and the final one (collective).
class CheckpointHook : public TrainingHook {
 public:
  CheckpointHook(
      checkpoint::TrainingState& state,
      std::filesystem::path dir,
      int64_t frequency_epochs,
      int64_t frequency_iterations,
      RunRecords& records);
  void on_step_end(const StepEvent& event) override;
  void on_epoch_end(checkpoint::TrainingProgress& progress) override;
  bool reads_results_after(const checkpoint::TrainingProgress& progress) const override;

 private:
  checkpoint::TrainingState& state_;
  std::filesystem::path dir_;
  int64_t frequency_epochs_;
  int64_t frequency_iterations_;
  RunRecords& records_;
};

} // namespace largo::train
