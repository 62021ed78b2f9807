// The state of a training run as one object that saves and loads itself: the parallel model
// (weights, optimizer state whole or in ZeRO shards, loss scaler and O2 masters), every
// rank's RNG stream, where the run stands (epoch, iteration, whether it is complete) and the
// last evaluation. What a checkpoint file holds, and what resume restores bit for bit on
// the CPU (data order and augmentation are functions of the seed, the epoch and the position,
// which this restores).
//
// A checkpoint is a dict that Python's torch.load reads:
//   model                {name: tensor}: every parameter and buffer (FSDP: gathered)
//   optimizer            optimizer state_dict, or {"type": "zero_sharded", ...} referring to
//                        one shard file per rank (sharded_checkpoint.h)
//   precision            loss scaler and O2 master weights (mixed_precision.h)
//   epoch, iteration_in_epoch, iteration, iterations_per_epoch, num_epochs, complete
//   rng_state            this rank's CPU generator; rng_states: every rank's
//   world_size, train_sampler (VISSL's view of the position, and what continuing the epoch
//   at another world size needs: num_replicas, dataset_size, samples_per_replica read in
//   this stretch, earlier_stretches [replicas, samples, ...]; order: what else a webdataset's
//   order depends on), top1, top5, best_top1,
//   largo_version, config (the effective YAML)
//   loss, loss_states    with a loss that keeps state (SwAV's queue): rank 0's {name: tensor}
//                        (VISSL's "loss" entry) and every rank's, stacked [world, ...]
//   ema_model            with HOOKS.EMA_MODEL.SAVE_EMA_MODEL: the model's average
//                        (optim::ModelEma::state_dict(), rank 0's; under FSDP, where each
//                        rank averages its own pieces, gathered as the model is, so the
//                        entry holds whole tensors by the model's names in every mode)
//
// save_model() writes the model alone: "model", the progress entries (epoch, iteration,
// top1, top5, best_top1), largo_version and config; MODEL.WEIGHTS_INIT and torch.load read it.
//
// Collectives: save() (every rank's RNG state, optimizer shard and loss state; FSDP gathers the
// model, and its average, unit by unit onto rank 0, which alone writes the main file) and
// save_model() (the model's gather). load() issues none.
#pragma once

#include <largo/checkpoint/checkpoint_file.h>
#include <largo/optim/model_ema.h>
#include <largo/parallel/parallelize.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace largo::checkpoint {

// A stretch of the epoch in progress that an earlier run read with another number of data
// replicas, up to the mid-epoch checkpoint this run resumed from: how many replicas read it,
// and how many samples of its order each had consumed (data::StatefulDistributedSampler's
// Stretch, which continues the epoch with the samples they left).
struct ReadStretch {
  int64_t num_replicas = 1;
  int64_t samples_per_replica = 0;
};

// Where a run stands. `epoch` is the epoch in progress (or the next to start) and
// `iteration_in_epoch` the optimizer steps of it already done; `iteration` counts all steps.
struct TrainingProgress {
  int64_t epoch = 0;
  int64_t iteration_in_epoch = 0;
  int64_t iteration = 0;
  // Of the epoch in progress: an epoch continued at another world size has the steps of its
  // earlier stretches plus those of this run's.
  int64_t iterations_per_epoch = 0;
  // An epoch begun by other numbers of data replicas (a mid-epoch resume at another world
  // size): what they read, oldest first, and the iteration_in_epoch at which this run's
  // stretch began. Empty and 0 for an epoch read by one world throughout; the trainer clears
  // them when the epoch ends.
  std::vector<ReadStretch> earlier_stretches;
  int64_t stretch_start_iteration = 0;
  int64_t num_epochs = 0;
  bool complete = false;
  std::optional<double> top1; // the last evaluation, percent
  std::optional<double> top5;
  std::optional<double> best_top1;
};

// How the training sampler reads, for the checkpoint's VISSL-style "train_sampler" entry:
// every rank recomputes its order from it and the progress; load() compares it with the
// saved one to tell whether the rest of an epoch is read as saved or continued anew.
struct SamplerDescription {
  // Or "StatefulDistributedSampler", or "WebDatasetSampler" (a webdataset's streaming order).
  std::string type = "DistributedSampler";
  int64_t batch_size = 1;                // per rank and micro-step
  int64_t micro_steps_per_iteration = 1; // gradient accumulation
  int64_t dataset_size = 0;              // the samples it partitions (DATA_LIMIT applied)
  // What else the epoch's order depends on, as text compared on resume (WebDatasetSampler:
  // "streams_per_replica=2 shuffle_buffer=1000"); empty for the other samplers. An epoch
  // whose order depended on it is resumed mid-epoch only with it unchanged.
  std::string order{};
};

class TrainingState {
 public:
  // `config_yaml` is stored as the checkpoint's "config"; `seed` re-seeds ranks that have no
  // saved stream to continue (a resume at another world size).
  TrainingState(
      parallel::ParallelModel& model,
      SamplerDescription sampler,
      std::string config_yaml,
      uint64_t seed);

  TrainingProgress progress;

  // Writes `dir/file_name` (and each rank's optimizer shard beside it, ZeRO 1-3), then points
  // `dir/checkpoint.torch` at it. Collective. Throws CheckpointError (on every rank) when a
  // rank cannot write its shard; the previous checkpoint then stays the latest.
  void save(const std::filesystem::path& dir, const std::string& file_name);

  // Writes the model's weights and where the run stands to `dir/file_name`, atomically, and
  // leaves checkpoint.torch as it is: a file to evaluate or initialize from, not to resume.
  // Collective.
  void save_model(const std::filesystem::path& dir, const std::string& file_name);

  // Restores a checkpoint written by save() at any world size and ZeRO stage (sharded
  // optimizer state is resharded or consolidated). Mid-epoch, a run that reads as the saved
  // one did continues its epoch as saved; one that reads otherwise (another number of data
  // replicas, batch size or accumulation) continues it with the samples not yet read: the
  // saved stretch is appended to progress.earlier_stretches and this run's begins at
  // iteration_in_epoch. That needs the stateful sampler in both runs, one rank per data
  // replica (DDP, ZeRO, FSDP: no pipeline or tensor parallelism) and the same training
  // samples; otherwise CheckpointError names what to change. progress.iterations_per_epoch
  // must be set beforehand (an epoch read as saved); for a continued one the caller sets it. With
  // `unless_final`, a final checkpoint (complete) is not loaded and false is returned
  // (CHECKPOINT.OVERWRITE_EXISTING: train again from scratch).
  bool load(const std::filesystem::path& path, bool unless_final = false);

  // What an evaluation needs of such a checkpoint (TEST_ONLY, largo eval): the progress, the
  // model and its average; not the optimizer (an evaluation may freeze what the checkpoint
  // trained: FREEZE_TRUNK_AND_HEAD), the RNG or the mid-epoch position, so any world size
  // evaluates it.
  void load_for_evaluation(const std::filesystem::path& path);

  // HOOKS.EMA_MODEL: the average of `model_tensors` the run keeps (both outlive this object):
  // the module's parameters and buffers, under FSDP this rank's pieces of them. save() writes
  // it as "ema_model" when `save_average` (SAVE_EMA_MODEL); load() restores it from a
  // checkpoint that has one, and otherwise restarts it from the loaded weights, as VISSL does.
  void attach_model_ema(optim::ModelEma& ema, optim::NamedTensors model_tensors, bool save_average);

  // A loss's state, the same names and shapes on every rank: save() writes it as "loss"
  // (rank 0's, VISSL's entry) and "loss_states" (every rank's); load() gives each rank its own
  // back at the saved world size. At another world size a state that is the same on every
  // rank (DINO's teacher and center, MoCo's momentum encoder and queue) is rank 0's for every
  // rank; one that is each rank's own (SwAV's queue and DeepCluster v2's memory, sized per
  // rank by the world) starts afresh with a warning, as it does from a checkpoint without it
  // (a queue refills within queue_length / global batch steps).
  enum class LossStateScope { kPerRank, kSameOnEveryRank };
  using LossStateGetter = std::function<std::map<std::string, at::Tensor>()>;
  using LossStateSetter = std::function<void(const std::map<std::string, at::Tensor>&)>;
  void attach_loss_state(LossStateGetter get, LossStateSetter set, LossStateScope scope);

 private:
  void insert_progress(StateDict& state) const;
  void load_progress(const StateDict& state, const std::string& where);
  void load_epoch_position(
      const StateDict& state, const std::string& where, int64_t iterations_per_epoch);
  StateDict state_dict(
      const c10::IValue& optimizer_entry,
      const at::Tensor& rng_states,
      std::vector<std::pair<std::string, at::Tensor>> model_state,
      const c10::IValue& ema_entry) const;
  c10::IValue model_ema_entry();
  void load_model(const StateDict& state, const std::string& where);
  void load_optimizer(
      const StateDict& state,
      const std::filesystem::path& checkpoint_dir,
      const std::string& where);
  void load_rng(const StateDict& state, int64_t saved_world_size);
  void load_model_ema(const StateDict& state, const std::string& where);
  void insert_loss_state(StateDict& state);
  void load_loss_state(const StateDict& state, int64_t saved_world_size, const std::string& where);

  parallel::ParallelModel& model_;
  SamplerDescription sampler_;
  std::string config_yaml_;
  uint64_t seed_;
  optim::ModelEma* ema_ = nullptr;
  optim::NamedTensors ema_tensors_;
  bool save_ema_ = false;
  LossStateGetter get_loss_state_;
  LossStateSetter set_loss_state_;
  LossStateScope loss_state_scope_ = LossStateScope::kPerRank;
};

} // namespace largo::checkpoint
