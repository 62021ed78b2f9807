// One resolved run: a config turned, once and before any data is loaded, into a validated
// and fully derived description of what `largo train` will do. `largo train`, `largo config`
// and `largo estimate` all go through it, so `largo config` refuses every combination that
// `largo train` would refuse, and `largo estimate` sizes the run the trainer builds
// (overrides included).
//
// What it derives: the precision policy, the options parallel::parallelize() is given
// (TrainerOptions::parallel with the run's precision, loss scaler, inf/NaN check and
// checkpointing probe set), the world (from the launcher's environment when
// it defines one, else DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE), the data's sample shape
// and class count (without reading the data), the model's options, the batch per rank, per
// node and globally, and the learning-rate schedules after VISSL's auto scaling.
//
// Library errors name library options (OptionError); here they are rethrown naming the YAML
// key the user wrote (option_keys.h). No collectives.
#pragma once

#include <largo/core/config.h>
#include <largo/parallel/parallelize.h>
#include <largo/train/trainer_options.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::train {

// The shape of a split's samples as the model sees them.
struct DataShape {
  std::vector<int64_t> sample_shape; // [channels, height, width]; several views: view 0's
  int64_t num_classes = 0;
  std::vector<std::vector<int64_t>> view_shapes; // each view's; empty for one image per sample
};

struct RunWorld {
  int world_size = 1;
  int procs_per_node = 1; // ranks on each node (LOCAL_WORLD_SIZE under a launcher)
  std::string backend = "gloo"; // what the process group will use (nccl only on CUDA)
};

struct RunPlan {
  TrainerOptions options; // the config's typed options
  RunWorld world;
  precision::PrecisionPolicy precision;
  DataShape train_shape; // empty in an evaluation-only run (TEST_ONLY): DATA.TRAIN is not read
  DataShape test_shape;  // empty when DATA.TEST is not read (TrainerOptions::reads_test_split)
  // With in_channels and image_size from model_data(), num_classes from the head's last dim
  // (MODEL.HEAD.PARAMS) or else from model_data()'s classes.
  models::ModelOptions model;
  parallel::ParallelOptions parallel; // options.parallel, completed (see the top)
  bool channels_last = false;         // options.channels_last, resolved for this machine
  bool sync_every_step = true;        // options.sync_every_step, resolved for this machine
  bool cuda_graph = false;            // options.cuda_graph, checked against the run

  int64_t batch_per_rank = 0;  // DATA.TRAIN.BATCHSIZE_PER_REPLICA, one micro-step
  int64_t batch_per_node = 0;  // per rank x ranks per node x accumulation steps
  int64_t global_batch = 0;    // per rank x world size x accumulation steps
  optim::ScheduleOptions lr;      // auto-scaled (OPTIMIZER.param_schedulers.lr)
  optim::ScheduleOptions lr_head; // the head's (lr_head, or lr when not different)

  // The split the model is sized from: DATA.TRAIN, or DATA.TEST in an evaluation-only run.
  const DataShape& model_data() const;

  // "O1 bfloat16 autocast, ZeRO-2 over 4 ranks, global batch 512 = 64 x 4 ranks x 2 steps"
  std::string describe() const;
};

// From a config: reads the YAML (trainer_config.h) and resolves the world from the
// launcher's environment when one is set. Throws ConfigError naming the key for anything
// `largo train` would refuse before touching data: bad values, combinations that do not
// compose, a model that cannot be cut as configured.
RunPlan resolve_run(const Config& config);

// The same from typed options (a library user's Trainer): `world` says how many ranks run.
RunPlan resolve_run(TrainerOptions options, RunWorld world);

// MODEL.PIPELINE.BALANCE time: the shape of the micro-batch of zeros the blocks are timed on,
// [BATCHSIZE_PER_REPLICA / NUM_MICROBATCHES (at least 1), sample shape...].
std::vector<int64_t> pipeline_timing_sample_shape(const RunPlan& plan);

// MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY is read by feature extraction only
// (train/feature_extraction.h, `largo extract`): in a training or evaluation run it would
// change nothing, so the Trainer and `largo train` refuse it (ConfigError).
void refuse_extraction_keys(const RunPlan& plan);

// The process group's backend for these options: NCCL moves CUDA tensors only, so a run on
// the CPU uses Gloo whatever DISTRIBUTED.BACKEND says (its default is VISSL's nccl).
std::string process_group_backend(const TrainerOptions& options);

// The shape of a split's samples and its class count, known without loading the data
// (data::peek_dataset_shape).
DataShape data_shape_of(const data::DataSplitOptions& split);

} // namespace largo::train
