#include <largo/train/trainer.h>

#include "run_environment.h"
#include "run_start.h"
#include <largo/checkpoint/run_directory.h>
#include <largo/checkpoint/training_state.h>
#include <largo/checkpoint/weights_init.h>
#include <largo/core/atomic_file.h>
#include <largo/core/error.h>
#include <largo/core/machine_report.h>
#include <largo/core/malloc_tuning.h>
#include <largo/core/rng_state.h>
#include <largo/models/channels_last_module.h>
#include <largo/models/flop_count.h>
#include <largo/models/model_factory.h>
#include <largo/models/multi_crop_model.h>
#include <largo/models/parameter_count.h>
#include <largo/optim/optimizer_factory.h>
#include <largo/optim/param_groups.h>
#include <largo/parallel/data_parallel/sync_batch_norm.h>
#include <largo/parallel/parallelize.h>
#include <largo/train/cuda_graph_step.h>
#include <largo/train/device_cache_hook.h>
#include <largo/train/local_data_copy.h>
#include <largo/train/model_ema_hook.h>
#include <largo/train/option_keys.h>
#include <largo/train/resume_policy.h>
#include <largo/train/run_peak_flops.h>
#include <largo/train/train_step.h>
#include <largo/train/training_data.h>
#include <largo/train/training_hooks.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace largo::train {
namespace fs = std::filesystem;
namespace {

// The split the model was sized from must still deliver what resolve_run peeked.
void check_data_matches_plan(const TrainingData& data, const RunPlan& plan) {
  const bool test_only = plan.options.test_only;
  const std::vector<int64_t>& delivered =
      test_only ? data.test_sample_shape() : data.train_sample_shape();
  if (delivered == plan.model_data().sample_shape) {
    return;
  }
  throw DataError(fmt::format(
      "the {} data delivers samples of [{}], but the model was planned for [{}] from the "
      "config; the data changed between the two ({}.DATA_PATHS)",
      test_only ? "test" : "training",
      fmt::join(delivered, ", "),
      fmt::join(plan.model_data().sample_shape, ", "),
      test_only ? "DATA.TEST" : "DATA.TRAIN"));
}

} // namespace

struct Trainer::State {
  RunPlan plan;
  std::string config_yaml;
  std::shared_ptr<comm::ProcessGroup> group;
  std::shared_ptr<parallel::DeviceMesh> mesh; // the run's layout of `group` (pp x dp x tp)
  torch::Device device{torch::kCPU};
  int64_t threads = 1;
  parallel::DataShard data_shard; // this rank's data replica: the batches it reads, its seed
  std::unique_ptr<TrainingData> data;
  models::RunModel model; // with a linear evaluation over its trunk (FEATURE_EVAL_SETTINGS)
  std::unique_ptr<parallel::ParallelModel> parallel;
  std::unique_ptr<checkpoint::TrainingState> state;
  // LOSS.name swav_loss, simclr_info_nce_loss, barlow_twins_loss, moco_loss, dino_loss or
  // deepclusterv2_loss
  std::unique_ptr<SelfSupervisedLoss> self_supervised;
  std::unique_ptr<TrainStep> step;
  std::unique_ptr<CudaGraphStep> graph_step; // MACHINE.CUDA_GRAPH: replays step's capture
  std::unique_ptr<optim::LrSchedule> lr_schedule;
  std::unique_ptr<optim::LrSchedule> lr_head_schedule;
  std::unique_ptr<optim::LrSchedule> weight_decay_schedule;      // null: constant
  std::unique_ptr<optim::LrSchedule> head_weight_decay_schedule; // null: constant
  std::optional<double> scheduled_weight_decay;                  // this step's, for the log
  RunRecords records;
  std::vector<std::unique_ptr<TrainingHook>> hooks;
  std::unique_ptr<optim::ModelEma> model_ema; // HOOKS.EMA_MODEL
  EvaluationHook* evaluation = nullptr;       // among the hooks when TEST_MODEL
  std::optional<MemoryTracker> step_memory;   // peak of each step, with activation checkpointing
  bool model_state_logged = false;
  int64_t num_parameters = 0; // the whole model's, counted before a pipeline empties the rest
  optim::OptimizerSpec optimizer_spec; // with LARC's excluded names filled in
  double earlier_fraction = 0.0;       // of the epoch in progress, read by its earlier stretches

  const TrainerOptions& options() const {
    return plan.options;
  }
  checkpoint::TrainingProgress& progress() {
    return state->progress;
  }
  fs::path run_dir() const {
    return plan.options.checkpoint.dir;
  }
  void setup();
  TrainSummary run();
  void build_model();
  int64_t flops_per_sample() const;
  // The run's peak FLOP/s for MFU (run_peak_flops.h), logged by rank 0 with its warning.
  double measure_peak_flops() const;
  bool will_resume() const;
  void parallelize_model();
  void build_self_supervised_loss();
  void prepare_clustering(int64_t epoch);
  parallel::ParallelOptions parallel_options() const;
  void open_records();
  void add_hooks();
  void keep_model_ema();
  void log_start() const;
  std::string sync_batch_norm_text() const;
  void set_epoch_length();
  double position_in_run(const optim::ScheduleOptions& schedule) const;
  void set_scheduled_values();
  void record_samples_read(
      TrainSummary& summary, const std::vector<int64_t>& order, int64_t first_batch);
  bool train_epoch(TrainSummary& summary, int64_t& iterations_left);
  StepResult run_step();
  // Whether the steps' results are read after this one: every step with a sync, else when a
  // hook wants them (a log line, a mid-epoch checkpoint), at the epoch's end, or when the run
  // stops.
  bool results_wanted_now(bool stopping) const;
  // Reads the steps not read yet (one device sync), records their losses and stops the run
  // at the first that diverged; returns them.
  std::vector<StepResult> read_unread_steps(TrainSummary& summary);
  void end_epoch();
  // Where a step ran, kept for the message when its results are read later.
  struct StepPosition {
    int64_t epoch = 0;
    int64_t iteration_in_epoch = 0;
    int64_t iteration = 0;
  };
  [[noreturn]] void throw_diverged(const StepResult& result, const StepPosition& at) const;
  std::vector<StepResult> unread_steps; // since the last read, oldest first
  std::vector<StepPosition> unread_positions;
};

Trainer::Trainer(
    TrainerOptions options,
    std::string effective_config_yaml,
    std::shared_ptr<comm::ProcessGroup> group)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.group =
      group ? std::move(group) : join_world(options.distributed, process_group_backend(options));
  s.plan = resolve_run(std::move(options), world_of(*s.group));
  refuse_extraction_keys(s.plan);
  s.config_yaml = std::move(effective_config_yaml);
  rethrow_with_yaml_keys([&] { s.setup(); });
}

Trainer::Trainer(
    RunPlan plan, std::string effective_config_yaml, std::shared_ptr<comm::ProcessGroup> group)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.group = group ? std::move(group) : join_world(plan.options.distributed, plan.world.backend);
  s.plan = std::move(plan);
  refuse_extraction_keys(s.plan);
  s.config_yaml = std::move(effective_config_yaml);
  rethrow_with_yaml_keys([&] { s.setup(); });
}

Trainer::~Trainer() = default;

models::TrunkHeadModel& Trainer::model() {
  return state_->model.model;
}

std::map<std::string, at::Tensor> Trainer::full_parameters() {
  std::map<std::string, at::Tensor> values;
  for (auto& [name, value] : state_->parallel->full_parameters()) {
    values.emplace(name, std::move(value));
  }
  return values;
}

void Trainer::State::setup() {
  tune_malloc_for_tensors();
  if (group->rank() == 0 && fs::is_directory(run_dir())) {
    remove_stale_temporaries(run_dir()); // before anything is written
  }
  threads = set_threads(options().num_threads, plan.world.procs_per_node);
  apply_kernel_switches(options());
  device = pick_device(options());
  // Built once, before anything that runs on it. Ranks that differ only in their pipeline
  // stage (or tensor-parallel shard) read the same batches: the mesh's data shard.
  mesh = rethrow_with_yaml_keys([&] { return parallel::make_device_mesh(group, plan.parallel); });
  data_shard = mesh->data_shard();
  TrainerOptions data_options =
      with_local_data_copies(options(), *group, plan.world.procs_per_node);
  data_options.channels_last =
      plan.channels_last ? TrainerOptions::ChannelsLast::kOn : TrainerOptions::ChannelsLast::kOff;
  data = std::make_unique<TrainingData>(
      std::move(data_options), data_shard.index, data_shard.count, device);
  check_data_matches_plan(*data, plan);
  build_model();
  parallelize_model();
  state = std::make_unique<checkpoint::TrainingState>(
      *parallel, data->sampler_description(), config_yaml, options().seed);
  progress().iterations_per_epoch = data->iterations_per_epoch();
  progress().num_epochs = options().optimizer.num_epochs;
  build_self_supervised_loss();
  step = std::make_unique<TrainStep>(
      *parallel,
      device,
      TrainStepOptions{
          options().loss,
          options().use_grad_clip,
          options().grad_clip_max_norm,
          options().grad_clip_norm_type,
          model.output_widths(),
          self_supervised.get(),
          plan.sync_every_step});
  if (plan.cuda_graph) {
    graph_step = std::make_unique<CudaGraphStep>(*step, *parallel, device);
  }
  lr_schedule = optim::make_schedule(plan.lr);
  lr_head_schedule = optim::make_schedule(plan.lr_head);
  const OptimizerOptions& optimizer = options().optimizer;
  if (optimizer.weight_decay_schedule) {
    weight_decay_schedule = optim::make_schedule(
        *optimizer.weight_decay_schedule, "OptimizerOptions::weight_decay_schedule");
  }
  if (optimizer.head_weight_decay_schedule) {
    head_weight_decay_schedule = optim::make_schedule(
        *optimizer.head_weight_decay_schedule, "OptimizerOptions::head_weight_decay_schedule");
  }
  open_records();
  add_hooks();
  keep_model_ema();
  log_start();
}

// Initialized from SEED_VALUE, or from MODEL.WEIGHTS_INIT on a fresh start (every rank reads
// the file: FSDP shards what each rank holds); then SyncBatchNorm in place of BatchNorm2d,
// before the model is wrapped for data parallelism.
void Trainer::State::build_model() {
  seed_everything(options().seed);
  model = models::build_run_model(plan.model);
  num_parameters = models::count_parameters(*model.module());
  const checkpoint::WeightsInitOptions& weights = options().weights_init;
  if (!weights.params_file.empty() && !will_resume()) {
    const checkpoint::WeightsInitReport report =
        checkpoint::init_weights_from_file(*model.module(), weights);
    if (group->rank() == 0) {
      spdlog::info("{}", report.describe(weights.params_file.string()));
    }
  }
  const SyncBatchNormSettings& sync = options().sync_batch_norm;
  if (sync.convert) {
    parallel::convert_sync_batchnorm(
        model.module(),
        group,
        parallel::sync_bn_group_size(
            sync.group_size, plan.world.procs_per_node, group->world_size()));
  }
  if (model.moco) {
    // The keys' batch is shuffled over the ranks that read different images: the mesh's "dp"
    // dimension (the same group as the loss's queue, SelfSupervisedLoss).
    model.moco->set_process_group(mesh->group("dp"));
  }
  model.module()->to(device);
  if (plan.channels_last) { // before parallelize(): DDP's buckets take the weights' strides
    models::convert_to_channels_last(*model.module());
  }
}

int64_t Trainer::State::flops_per_sample() const {
  if (model.linear_eval) {
    return models::linear_eval_training_flops_per_sample(
        plan.model, model.linear_eval->trunk_blocks_run());
  }
  return models::training_flops_per_sample(plan.model);
}

double Trainer::State::measure_peak_flops() const {
  const fs::path cache = default_peak_flops_cache();
  const RunPeakFlops peak =
      run_peak_flops(device, plan.precision, group->world_size(), plan.world.procs_per_node, cache);
  if (group->rank() == 0) {
    spdlog::info(
        "peak: {}/s per rank ({}, {} {}), the MFU's denominator",
        models::format_flops(peak.per_rank.flops_per_sec),
        peak.per_rank.key,
        peak.per_rank.cached ? "cached in" : "measured now, cached in",
        cache.string());
    if (peak.slow_precision_warning) {
      spdlog::warn("{}", *peak.slow_precision_warning);
    }
  }
  return peak.world;
}

// Whether this run continues from a checkpoint of its directory (train/resume_policy.h).
bool Trainer::State::will_resume() const {
  return (options().checkpoint.auto_resume || options().test_only) && fs::is_directory(run_dir()) &&
         !checkpoint_files(run_dir()).empty();
}

void Trainer::State::parallelize_model() {
  const OptimizerOptions& optimizer = options().optimizer;
  optim::OptimizerSpec spec = optimizer.spec;
  if (spec.use_larc && optimizer.larc_exclude_bias_and_norm) {
    for (auto& name : optim::bias_and_norm_parameter_names(
             *model.module(), optimizer.param_groups.is_norm_layer)) {
      spec.larc.excluded_from_adaptation.insert(std::move(name));
    }
  }
  if (spec.name == "lars" && optimizer.lars_exclude_bias_and_norm) {
    for (auto& name : optim::one_dimensional_parameter_names(*model.module())) {
      spec.lars.excluded_from_adaptation.insert(std::move(name));
    }
  }
  optimizer_spec = spec;
  auto make_optimizer = [spec](std::vector<optim::ParamGroup> groups) {
    return optim::make_optimizer(std::move(groups), spec);
  };
  optim::ParamGroupOptions groups = optimizer.param_groups;
  if (model.linear_eval) {
    groups.head_prefix = model.linear_eval->head_prefix();
  }
  parallel = rethrow_with_yaml_keys([&] {
    // Step 0: tensor parallelism splits the layers before the groups hold their tensors.
    parallel::apply_tensor_parallel_plan(*model.module(), *mesh, plan.parallel);
    return parallel::parallelize(
        model.any_module(),
        optim::build_param_groups(*model.module(), groups),
        make_optimizer,
        mesh,
        parallel_options());
  });
  if (parallel->activation_memory_report()) {
    step_memory.emplace(device);
  }
  // Dropout streams differ per data replica (VISSL's SEED_VALUE + rank, where each rank is a
  // replica); replica 0 keeps SEED_VALUE. A replica's ranks (its pipeline stages, its
  // tensor-parallel shards) share one stream, so the shards drop the same elements of the
  // activations they all compute and their replicated parameters stay equal. Dropout inside a
  // sharded layer then repeats one mask on every shard's slice (no per-shard stream as
  // Megatron's RNG tracker keeps).
  seed_everything(options().seed + static_cast<uint64_t>(data_shard.index));
}

// SwAV's queue is drawn from SEED_VALUE + the rank's data replica (each replica keeps its own,
// as each rank does in VISSL; a replica's ranks see the same batches) and checkpointed per
// rank. MoCo's is drawn from SEED_VALUE on every rank: its queue is the same everywhere
// (every rank writes the gathered keys), so that 2 ranks train as one process from the first
// step; VISSL's ranks start from their own noise until the first queue_size / global batch
// steps have overwritten it.
void Trainer::State::build_self_supervised_loss() {
  SelfSupervisedLossOptions options = this->options().self_supervised;
  if (!options.enabled()) {
    return;
  }
  // DINO's teacher momentum runs its cosine over the whole run, VISSL's task.max_iteration.
  options.dino_max_iteration =
      std::max<int64_t>(1, progress().num_epochs * progress().iterations_per_epoch);
  // DeepCluster v2's memory holds the images each rank reads in an epoch, its assignments
  // every image of the dataset (VISSL's num_train_samples).
  models::DeepClusterV2MemoryOptions& memory = options.deepclusterv2_memory;
  memory.num_samples = data->train_dataset_size();
  memory.memory_size_per_rank = data->train_samples_per_epoch();
  const int64_t most_clusters =
      memory.num_clusters.empty()
          ? 0
          : *std::max_element(memory.num_clusters.begin(), memory.num_clusters.end());
  if (options.is_deepclusterv2() && most_clusters > memory.memory_size_per_rank) {
    throw config_error(
        "LOSS.deepclusterv2_loss.num_clusters",
        fmt::format("[{}]", fmt::join(memory.num_clusters, ", ")),
        fmt::format(
            "at most the {} images each rank reads per epoch: the k-means draws its initial "
            "centroids from rank 0's memory of them (use fewer clusters, or fewer ranks)",
            memory.memory_size_per_rank));
  }
  const uint64_t queue_seed = options.is_moco()
                                  ? this->options().seed
                                  : this->options().seed + static_cast<uint64_t>(data_shard.index);
  self_supervised = std::make_unique<SelfSupervisedLoss>(
      options,
      static_cast<int64_t>(plan.model.view_shapes.size()),
      *parallel->module(),
      parallel->data_parallel_group(),
      plan.batch_per_rank,
      queue_seed);
  SelfSupervisedLoss* loss = self_supervised.get();
  state->attach_loss_state(
      [loss] { return loss->state_dict(); },
      [loss](const std::map<std::string, at::Tensor>& values) { loss->load_state_dict(values); },
      loss->state_is_same_on_every_rank()
          ? checkpoint::TrainingState::LossStateScope::kSameOnEveryRank
          : checkpoint::TrainingState::LossStateScope::kPerRank);
}

// The plan's options, with the sample that MODEL.PIPELINE.BALANCE time measures the blocks
// on (one micro-batch of zeros), which needs the device.
parallel::ParallelOptions Trainer::State::parallel_options() const {
  parallel::ParallelOptions options = plan.parallel;
  parallel::PipelineParallelOptions& stages = options.pipeline.stages;
  if (stages.balance() == parallel::StageBalance::kTime) {
    stages.balance_sample(at::zeros(
        pipeline_timing_sample_shape(plan), at::TensorOptions().device(device)));
  }
  return options;
}

void Trainer::State::open_records() {
  if (group->rank() != 0) {
    return;
  }
  fs::create_directories(run_dir());
  if (!config_yaml.empty()) { // an evaluation keeps the training run's config beside its own
    write_file_atomically(
        run_dir() / (options().test_only ? "test_config.yaml" : "train_config.yaml"), config_yaml);
  }
  records.metrics = std::make_unique<MetricsWriter>(run_dir() / "metrics.jsonl");
  if (options().use_tensorboard) {
    records.tensorboard = std::make_unique<TensorBoardWriter>(run_dir() / "tb_logs");
  }
}

void Trainer::State::add_hooks() {
  if (!options().test_only) { // an evaluation takes no training steps to log
    hooks.push_back(std::make_unique<LoggingHook>(
        *parallel,
        data->train_loader(),
        records,
        options().log_frequency,
        flops_per_sample(),
        measure_peak_flops()));
  }
  if (options().test_model) {
    EvaluationOptions evaluation{
        options().topk_values, options().loss, plan.test_shape.sample_shape, model.output_widths()};
    auto save_best = [this](const checkpoint::TrainingProgress&) {
      state->save_model(run_dir(), checkpoint::kBestModelName);
    };
    auto hook = std::make_unique<EvaluationHook>(
        *parallel,
        *data,
        device,
        evaluation,
        options().test_every_num_epoch,
        records,
        options().test_only ? EvaluationHook::NewBestCallback() : save_best); // TEST_ONLY: none
    this->evaluation = hook.get();
    hooks.push_back(std::move(hook));
  }
  if (options().empty_device_cache_every > 0 && !options().test_only) {
    hooks.push_back(std::make_unique<DeviceCacheHook>(device, options().empty_device_cache_every));
  }
  hooks.push_back(std::make_unique<CheckpointHook>(
      *state,
      run_dir(),
      options().checkpoint.frequency_epochs,
      options().checkpoint.frequency_iterations,
      records));
}

// The average is updated before the other hooks see the step (a checkpoint then holds it),
// checkpointed by the state and evaluated beside the model (model_ema_hook.h).
void Trainer::State::keep_model_ema() {
  const ModelEmaSettings& settings = options().model_ema;
  if (!settings.enabled()) {
    return;
  }
  const optim::NamedTensors tensors = parallel->local_state();
  model_ema = std::make_unique<optim::ModelEma>(tensors, settings.average);
  state->attach_model_ema(*model_ema, tensors, settings.save);
  hooks.insert(hooks.begin(), std::make_unique<ModelEmaHook>(*model_ema, tensors));
  if (settings.meters) {
    evaluation->also_evaluate(*model_ema, tensors);
  }
}

void Trainer::State::log_start() const {
  const std::string training = options().test_only ? "evaluation only (DATA.TRAIN not read)"
                                                   : fmt::format(
                                                         "{} training samples, {} iterations/epoch",
                                                         data->num_train_samples(),
                                                         data->iterations_per_epoch());
  spdlog::info(
      "model {}{}: {} parameters, {} per training sample ({}); {}; {} test samples; {} threads "
      "on {}",
      plan.model.trunk_name,
      model.linear_eval ? fmt::format(
                              ", linear evaluation with {} head{}",
                              model.linear_eval->num_outputs(),
                              model.linear_eval->num_outputs() == 1 ? "" : "s")
                        : "",
      num_parameters,
      models::format_flops(static_cast<double>(flops_per_sample())),
      model.linear_eval  ? "the frozen trunk forward, the heads 3 x forward"
      : model.multi_crop ? "3 x forward, every view at its size"
      : model.moco       ? "3 x forward of view 0, the momentum encoder's forward of view 1"
      : model.dino       ? "3 x forward of every crop, the teacher's forward of its crops"
                         : "3 x forward",
      training,
      data->num_test_samples(),
      threads,
      device.str());
  if (group->rank() == 0) { // the BLAS, ISA and thread counts, warnings that say how to fix them
    log_machine_report(describe_machine({plan.world.procs_per_node}));
  }
  spdlog::info("run: {}", plan.describe());
  spdlog::info("parallel: {}", parallel->describe());
  spdlog::info("placements on the mesh: {}", parallel->placements().describe());
  spdlog::info("optimizer: {}; {}", optim::describe(optimizer_spec), sync_batch_norm_text());
  if (self_supervised) {
    spdlog::info("loss: {}", self_supervised->describe());
  }
  if (const auto& report = parallel->activation_memory_report()) {
    spdlog::info("activation checkpointing: {}", report->describe());
  }
}

std::string Trainer::State::sync_batch_norm_text() const {
  const SyncBatchNormSettings& sync = options().sync_batch_norm;
  if (!sync.convert) {
    return "SyncBatchNorm off";
  }
  // sync_bn_group_size's 0 is "all ranks" (GROUP_SIZE 0): said as the count it stands for.
  const int64_t size =
      parallel::sync_bn_group_size(sync.group_size, plan.world.procs_per_node, group->world_size());
  return fmt::format(
      "SyncBatchNorm on, statistics over groups of {} rank(s)",
      size == 0 ? group->world_size() : size);
}

// The steps of the epoch in progress. One continued at another world size (earlier_stretches)
// has its earlier stretches' steps and those that read this run's share of what they left.
void Trainer::State::set_epoch_length() {
  checkpoint::TrainingProgress& p = progress();
  earlier_fraction = data->fraction_read(p.earlier_stretches);
  if (p.earlier_stretches.empty()) {
    p.iterations_per_epoch = data->iterations_per_epoch();
    return;
  }
  const auto order = data->train_epoch_order(p.epoch, p.earlier_stretches);
  p.iterations_per_epoch =
      p.stretch_start_iteration + data->iterations_for(static_cast<int64_t>(order.size()));
}

// How far through the run a step-wise schedule stands (0 to 1). In an epoch continued at
// another world size the steps no longer count alike, so the schedule goes on from the share
// of the epoch's samples read before this run's stretch, and over the stretch's steps to the
// epoch's end; an epoch read by one world throughout counts its steps, as it always has.
double Trainer::State::position_in_run(const optim::ScheduleOptions& schedule) const {
  const checkpoint::TrainingProgress& p = state->progress;
  const double where = optim::where_for(
      p.epoch,
      p.iteration_in_epoch,
      p.iterations_per_epoch,
      p.num_epochs,
      schedule.update_interval);
  if (p.earlier_stretches.empty() || schedule.update_interval == "epoch") {
    return where;
  }
  const int64_t steps = p.iterations_per_epoch - p.stretch_start_iteration;
  const double in_stretch =
      steps > 0 ? static_cast<double>(p.iteration_in_epoch - p.stretch_start_iteration) / steps
                : 1.0;
  const double in_epoch = earlier_fraction + (1.0 - earlier_fraction) * in_stretch;
  return (static_cast<double>(p.epoch) + in_epoch) / static_cast<double>(p.num_epochs);
}

// The learning rates and, where scheduled, the weight decays of this step's groups.
void Trainer::State::set_scheduled_values() {
  auto value_at = [&](const optim::LrSchedule& schedule, const optim::ScheduleOptions& options) {
    return schedule.value_at(std::min(position_in_run(options), 1.0));
  };
  const double trunk_lr = value_at(*lr_schedule, plan.lr);
  const double head_lr = value_at(*lr_head_schedule, plan.lr_head);
  const OptimizerOptions& optimizer = options().optimizer;
  std::optional<double> head_weight_decay;
  scheduled_weight_decay.reset();
  if (weight_decay_schedule) {
    scheduled_weight_decay = value_at(*weight_decay_schedule, *optimizer.weight_decay_schedule);
  }
  if (head_weight_decay_schedule) {
    head_weight_decay =
        value_at(*head_weight_decay_schedule, *optimizer.head_weight_decay_schedule);
  }
  for (auto& group : parallel->optimizer().param_groups()) {
    group.lr = group.name.rfind("head", 0) == 0 ? head_lr : trunk_lr; // "head", "head_no_wd"
    const optim::DecaySource source = optim::decay_source(group.name);
    if (source == optim::DecaySource::kWeightDecay && scheduled_weight_decay) {
      group.weight_decay = *scheduled_weight_decay;
    } else if (source == optim::DecaySource::kHeadWeightDecay && head_weight_decay) {
      group.weight_decay = *head_weight_decay;
    }
  }
}

// The samples the steps since start_epoch(order, ..., first_batch) read.
void Trainer::State::record_samples_read(
    TrainSummary& summary, const std::vector<int64_t>& order, int64_t first_batch) {
  if (!options().record_samples_read) {
    return;
  }
  const data::DataLoader& loader = data->train_loader();
  const int64_t batch_size = loader.options().batch_size;
  const auto begin = std::min<size_t>(first_batch * batch_size, order.size());
  const auto end = std::min<size_t>(loader.next_batch_index() * batch_size, order.size());
  auto& read = summary.samples_read[progress().epoch];
  read.insert(read.end(), order.begin() + begin, order.begin() + end);
}

// One optimizer step over the next batches of the epoch; the last step of an epoch takes
// what is left when the batches do not divide evenly.
StepResult Trainer::State::run_step() {
  data::DataLoader& loader = data->train_loader();
  const int64_t batches_left = loader.num_batches() - loader.next_batch_index();
  auto next_batch = [&loader] {
    auto batch = loader.next();
    TORCH_INTERNAL_ASSERT(batch.has_value(), "the loader ran out inside an optimizer step");
    return std::move(*batch);
  };
  if (step_memory) {
    step_memory->start_window();
  }
  try {
    const int64_t micro_batches = std::min(options().gradient_accumulation_steps, batches_left);
    return graph_step ? graph_step->run(next_batch, micro_batches)
                      : step->run(next_batch, micro_batches);
  } catch (const TrainingError& error) { // the loss scale cannot back off any further
    records.progress_bar.clear();
    throw TrainingError(fmt::format(
        "at epoch {} iteration {} (global iteration {}): {}",
        progress().epoch + 1,
        progress().iteration_in_epoch + 1,
        progress().iteration + 1,
        with_yaml_keys(error.what()))); // the library names its options
  }
}

void Trainer::State::throw_diverged(const StepResult& result, const StepPosition& at) const {
  const checkpoint::TrainingProgress& p = state->progress;
  const std::string read_later =
      at.iteration + 1 < p.iteration
          ? fmt::format(
                "; read at global iteration {}: without a sync every step "
                "(MACHINE.SYNC_EVERY_STEP) the run reads its losses when it logs or saves",
                p.iteration)
          : "";
  const std::string where = fmt::format(
      "at epoch {} iteration {} (global iteration {}{}{})",
      at.epoch + 1,
      at.iteration_in_epoch + 1,
      at.iteration + 1,
      group->world_size() > 1 ? fmt::format(", rank {} of {}", group->rank(), group->world_size())
                              : "",
      read_later);
  const std::string what =
      !std::isfinite(result.non_finite_loss)
          ? fmt::format("the training loss is {} {}", result.non_finite_loss, where)
          : fmt::format("a gradient is inf or NaN {} (on this rank or another)", where);
  throw TrainingError(fmt::format(
      "{}; training stopped without writing a checkpoint, so {} still holds the last good "
      "state. Lower the learning rate or check the data, then resume.",
      what,
      (run_dir() / checkpoint::kLatestCheckpointName).string()));
}

bool Trainer::State::results_wanted_now(bool stopping) const {
  const checkpoint::TrainingProgress& p = state->progress;
  if (plan.sync_every_step || stopping || p.iteration_in_epoch == p.iterations_per_epoch) {
    return true;
  }
  return std::any_of(
      hooks.begin(), hooks.end(), [&p](const auto& hook) { return hook->reads_results_after(p); });
}

std::vector<StepResult> Trainer::State::read_unread_steps(TrainSummary& summary) {
  read_step_results(unread_steps);
  for (size_t i = 0; i < unread_steps.size(); ++i) {
    const StepResult& result = unread_steps[i];
    if (!result.finite && !parallel->precision().has_loss_scaling()) {
      records.progress_bar.clear();
      throw_diverged(result, unread_positions[i]);
    }
    summary.iteration_losses.push_back(result.loss);
  }
  unread_positions.clear();
  return std::exchange(unread_steps, {});
}

bool Trainer::State::train_epoch(TrainSummary& summary, int64_t& iterations_left) {
  checkpoint::TrainingProgress& p = progress();
  model.module()->train(); // a linear evaluation keeps its frozen trunk in eval mode
  // An epoch continued at another world size counts its batches from this run's stretch.
  const std::vector<int64_t> order = data->train_epoch_order(p.epoch, p.earlier_stretches);
  const int64_t first_batch =
      (p.iteration_in_epoch - p.stretch_start_iteration) * options().gradient_accumulation_steps;
  if (self_supervised) {
    prepare_clustering(p.epoch); // before the epoch's loader starts: the first pass reads too
  }
  data->train_loader().start_epoch(order, p.epoch, first_batch);
  while (p.iteration_in_epoch < p.iterations_per_epoch) {
    set_scheduled_values();
    if (self_supervised) {
      self_supervised->start_iteration(p.iteration);
    }
    const StepPosition position{p.epoch, p.iteration_in_epoch, p.iteration};
    unread_steps.push_back(run_step());
    unread_positions.push_back(position);
    StepResult result = unread_steps.back();
    ++p.iteration;
    ++p.iteration_in_epoch;
    std::vector<StepResult> steps_read;
    if (results_wanted_now(/*stopping=*/iterations_left == 1)) {
      steps_read = read_unread_steps(summary);
      result = steps_read.back(); // this step's, read
    }
    if (!model_state_logged) { // after the first step, when the optimizer state exists
      model_state_logged = true;
      spdlog::info(
          "{}", parallel->memory_report(&options().optimizer.spec).describe(group->rank()));
    }
    const auto peak = step_memory ? std::optional(step_memory->window_peak_bytes()) : std::nullopt;
    const StepEvent event{
        p,
        result,
        steps_read,
        parallel->optimizer().param_groups().front().lr,
        peak,
        scheduled_weight_decay};
    for (auto& hook : hooks) {
      hook->on_step_end(event);
    }
    if (iterations_left > 0 && --iterations_left == 0) {
      records.progress_bar.clear();
      summary.interrupted = true;
      record_samples_read(summary, order, first_batch);
      return false;
    }
  }
  record_samples_read(summary, order, first_batch);
  return true;
}

// DeepCluster v2 (nothing for the other losses): VISSL's InitMemoryHook, one pass over epoch
// 0's batches through the model (in training mode, without gradients) filling the memory, on a
// fresh start or when the checkpoint held no memory for this world; then its
// ClusterMemoryHook, the k-means, unless a mid-epoch checkpoint holds this epoch's.
void Trainer::State::prepare_clustering(int64_t epoch) {
  if (self_supervised->memory_needs_filling()) {
    torch::NoGradGuard no_grad;
    data::DataLoader& loader = data->train_loader();
    loader.start_epoch(data->train_epoch_order(0), 0, 0);
    while (auto batch = loader.next()) {
      const at::Tensor input = models::pack_views(batch->views).to(device, /*non_blocking=*/true);
      self_supervised->fill_memory(
          parallel->forward(input), batch->labels.to(device, /*non_blocking=*/true));
    }
    self_supervised->finish_filling_memory();
  }
  self_supervised->start_epoch(epoch);
}

void Trainer::State::end_epoch() {
  checkpoint::TrainingProgress& p = progress();
  ++p.epoch;
  p.iteration_in_epoch = 0;
  p.complete = p.epoch == p.num_epochs;
  p.earlier_stretches.clear(); // the next epoch is read by this world alone
  p.stretch_start_iteration = 0;
  set_epoch_length();
  for (auto& hook : hooks) {
    hook->on_epoch_end(p);
  }
}

TrainSummary Trainer::run() {
  // The library's errors name its options; this run was configured in YAML keys.
  return rethrow_with_yaml_keys([&] { return state_->run(); });
}

TrainSummary Trainer::State::run() {
  State& s = *this;
  checkpoint::TrainingProgress& p = s.progress();
  TrainSummary summary;
  if (s.options().test_only) {
    summary.resumed =
        load_for_evaluation(*s.state, s.run_dir(), s.options().weights_init.params_file, *s.group);
    s.evaluation->report(p);
    summary.epochs_completed = p.epoch;
    summary.iterations = p.iteration;
    summary.final_top1 = p.top1;
    summary.final_top5 = p.top5;
    return summary;
  }
  summary.resumed = resume_or_start_fresh(*s.state, s.options().checkpoint, *s.group);
  s.set_epoch_length(); // a resumed epoch may be continued at another world size
  if (p.complete) {
    spdlog::info(
        "training is already complete in {} (final checkpoint, {} epochs); set "
        "CHECKPOINT.OVERWRITE_EXISTING=True to train again",
        s.run_dir().string(),
        p.epoch);
    summary.already_complete = true;
  }
  int64_t iterations_left = s.options().stop_after_iterations;
  while (!p.complete && p.epoch < p.num_epochs) {
    if (!s.train_epoch(summary, iterations_left)) {
      break; // interrupted (testing aid): as if killed, nothing more is written
    }
    s.end_epoch();
  }
  summary.epochs_completed = p.epoch;
  summary.iterations = p.iteration;
  summary.final_top1 = p.top1;
  summary.final_top5 = p.top5;
  return summary;
}

} // namespace largo::train
