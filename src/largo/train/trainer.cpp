#include <largo/train/trainer.h>

#include <largo/checkpoint/checkpoint_file.h>
#include <largo/comm/world_info.h>
#include <largo/checkpoint/model_state.h>
#include <largo/core/atomic_file.h>
#include <largo/core/error.h>
#include <largo/core/malloc_tuning.h>
#include <largo/core/memory_tracker.h>
#include <largo/core/rng_state.h>
#include <largo/data/cifar10_dataset.h>
#include <largo/data/data_loader.h>
#include <largo/data/idx_dataset.h>
#include <largo/data/sampler.h>
#include <largo/data/synthetic_dataset.h>
#include <largo/models/model_factory.h>
#include <largo/models/parameter_count.h>
#include <largo/optim/grad_clipping.h>
#include <largo/optim/optimizer_factory.h>
#include <largo/parallel/checkpointed_trunk.h>
#include <largo/parallel/distributed_data_parallel.h>
#include <largo/parallel/fully_sharded_data_parallel.h>
#include <largo/parallel/memory_estimate.h>
#include <largo/parallel/sharded_data_parallel.h>
#include <largo/parallel/sharded_optimizer.h>
#include <largo/precision/mixed_precision.h>
#include <largo/train/accuracy_meter.h>
#include <largo/train/metrics_writer.h>
#include <largo/train/progress_bar.h>
#include <largo/train/data_checks.h>
#include <largo/train/run_directory.h>
#include <largo/train/sharded_checkpoint.h>
#include <largo/train/tensorboard_writer.h>
#include <largo/train/trainer_config.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <thread>

namespace largo::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kLatestCheckpointName = "checkpoint.torch";
constexpr const char* kLargoVersion = "0.1.0";

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string format_duration(double seconds) {
  auto total = static_cast<int64_t>(std::max(0.0, seconds));
  if (total >= 3600) {
    return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
  }
  return fmt::format("{}m{:02d}s", total / 60, total % 60);
}

std::shared_ptr<const data::Dataset> load_dataset(const DataSplitOptions& split, data::Split which,
                                                  uint64_t seed) {
  if (split.source == "synthetic") {
    return std::make_shared<data::SyntheticDataset>(split.synthetic_num_samples,
                                                    split.synthetic_image_shape,
                                                    split.synthetic_num_classes, seed);
  }
  if (split.dataset_name == "CIFAR10") {
    return std::make_shared<data::Cifar10Dataset>(data::Cifar10Dataset::load(split.path, which));
  }
  return std::make_shared<data::IdxDataset>(data::IdxDataset::load(split.path, which));
}

// The sample indices of a split with DATA_LIMIT applied: the first `limit` entries of a
// permutation seeded with DATA_LIMIT_SAMPLING.SEED (all indices when no limit).
std::vector<int64_t> subset_indices(int64_t dataset_size, const DataSplitOptions& split) {
  std::vector<int64_t> indices(dataset_size);
  std::iota(indices.begin(), indices.end(), 0);
  if (split.data_limit < 0 || split.data_limit >= dataset_size) {
    return indices;
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(split.data_limit_seed);
  at::Tensor permutation = torch::randperm(dataset_size, generator, torch::kLong);
  auto* data = permutation.data_ptr<int64_t>();
  std::vector<int64_t> subset(data, data + split.data_limit);
  std::sort(subset.begin(), subset.end());
  return subset;
}

// The process group of this run: the one given, or one from the launcher's environment.
std::shared_ptr<comm::ProcessGroup> join_world(const DistributedOptions& options,
                                               const std::string& device) {
  auto world = comm::world_from_environment();
  if (!world || world->world_size == 1) {
    return comm::ProcessGroup::single_process();
  }
  comm::ProcessGroupOptions group_options;
  group_options.backend = options.backend;
  // NCCL moves CUDA tensors only: a run on the CPU (asked for, or the GPU fallback) uses
  // Gloo whatever DISTRIBUTED.BACKEND says (its default is VISSL's nccl).
  if (options.backend == "nccl" && (device != "gpu" || !torch::cuda::is_available())) {
    group_options.backend = "gloo";
    if (world->rank == 0) {
      spdlog::info("training on the CPU: using the gloo backend (DISTRIBUTED.BACKEND is nccl)");
    }
  }
  group_options.rank = world->rank;
  group_options.world_size = world->world_size;
  group_options.master_addr = world->master_addr;
  group_options.master_port = world->master_port;
  group_options.rendezvous_timeout = std::chrono::seconds(options.rendezvous_timeout_seconds);
  group_options.collective_timeout = std::chrono::seconds(options.collective_timeout_seconds);
  return comm::ProcessGroup::create(group_options);
}

// Rank r's loader seed: rank 0 keeps the configured seed (a one-process run is unchanged);
// the others get distinct streams, so ranks do not augment their samples identically.
uint64_t loader_seed(uint64_t seed, int rank) {
  return seed ^ (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull);
}

// What FSDP (ZeRO stage 3) composes with in this version; the rest is a ConfigError that
// says what to change, rather than a run that silently does something else.
void check_fsdp_supported(const TrainerOptions& options,
                          const precision::PrecisionPolicy& policy) {
  const FsdpOptions& fsdp = options.fsdp;
  if (fsdp.fp32_reduce_scatter && !fsdp.mixed_precision) {
    throw ConfigError(
        "MODEL.FSDP_CONFIG.fp32_reduce_scatter needs mixed_precision (AUTO_SETUP_FSDP turns "
        "mixed_precision on with MODEL.AMP_PARAMS.USE_AMP): turn AMP on, or set "
        "fp32_reduce_scatter to False");
  }
  if (fsdp.compute_dtype != "float32" && !fsdp.mixed_precision) {
    throw ConfigError(fmt::format(
        "MODEL.FSDP_CONFIG.compute_dtype {} needs mixed_precision (AUTO_SETUP_FSDP turns it on "
        "with MODEL.AMP_PARAMS.USE_AMP): turn AMP on, or set compute_dtype float32",
        fsdp.compute_dtype));
  }
  if (options.zero.shard_optimizer_state) {
    throw ConfigError(
        "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP (ZeRO stage 3) and ZeRO stage 1/2 (OPTIMIZER.use_zero, "
        "OPTIMIZER.name zero or MODEL.SHARDED_DDP_SETUP.USE_SDP) are both on; stage 3 already "
        "shards the optimizer state and the gradients: turn the other off");
  }
  if (policy.cast_model || policy.master_weights) {
    throw ConfigError(fmt::format(
        "FSDP with {}: FSDP makes its own low-precision copies of float32 shards "
        "(MODEL.FSDP_CONFIG.AMP_TYPE O2 or compute_dtype) or runs autocast over float32 units "
        "(MODEL.AMP_PARAMS.AMP_TYPE pytorch, which AUTO_SETUP_FSDP selects)",
        policy.describe()));
  }
}

void log_fsdp_units(const parallel::FullyShardedDataParallel& fsdp,
                    const optim::OptimizerSpec& spec) {
  std::vector<std::string> units;
  for (const auto& unit : fsdp.units()) {
    units.push_back(fmt::format("{} ({} parameters)", unit.name, unit.layout.total_numel()));
  }
  const auto& options = fsdp.options();
  const std::string compute =
      options.compute_dtype
      ? fmt::format("{} compute copies of float32 shards (BatchNorm in float32), gradients "
                    "reduced in {}",
                    c10::toString(*options.compute_dtype),
                    options.fp32_reduce_scatter ? "float32" : c10::toString(*options.compute_dtype))
      : std::string("compute in the parameters' dtype");
  spdlog::info("ZeRO stage 3 (FSDP): parameters, gradients and optimizer state ({}{}) sharded "
               "over {} rank(s), {:.2f} MiB of parameter shards per rank; units: {}; "
               "reshard_after_forward {}, prefetch {}; {}",
               spec.name, spec.use_larc ? " with LARC" : "", fsdp.process_group().world_size(),
               static_cast<double>(fsdp.shard_bytes()) / (1024.0 * 1024.0),
               fmt::join(units, ", "), options.reshard_after_forward, options.prefetch, compute);
}

} // namespace

struct Trainer::State {
  TrainerOptions options;
  std::string config_yaml;
  torch::Device device{torch::kCPU};
  std::shared_ptr<comm::ProcessGroup> group;
  bool is_rank0() const {
    return group->rank() == 0;
  }

  std::shared_ptr<const data::Dataset> train_data;
  std::shared_ptr<const data::Dataset> test_data;
  std::vector<int64_t> train_subset; // dataset indices the sampler's positions map to
  std::vector<int64_t> test_subset;
  std::unique_ptr<data::DataLoader> train_loader;
  std::unique_ptr<data::DataLoader> test_loader;
  int64_t iterations_per_epoch = 0;

  models::TrunkHeadModel model{nullptr};
  std::unique_ptr<precision::MixedPrecision> mixed_precision; // MODEL.AMP_PARAMS
  std::unique_ptr<parallel::DistributedDataParallel> ddp; // when the world has > 1 rank
  // Set when MODEL.ACTIVATION_CHECKPOINTING is on: the model's forward with checkpointed
  // trunk segments, and the tracker that measures each step's peak memory (the largest
  // since the last train line is in window_step_peak_bytes).
  std::optional<parallel::CheckpointedTrunk> checkpointed_trunk;
  std::optional<MemoryTracker> step_memory;
  int64_t window_step_peak_bytes = 0;
  bool logged_first_step_memory = false;
  std::unique_ptr<optim::Optimizer> optimizer;
  // ZeRO: `optimizer` is a ShardedOptimizer (stage 1), and with stage 2 (and > 1 rank) a
  // ShardedDataParallel reduces the gradients instead of `ddp`.
  parallel::ShardedOptimizer* sharded_optimizer = nullptr;
  std::unique_ptr<parallel::ShardedDataParallel> sdp;
  // ZeRO stage 3 (MODEL.FSDP_CONFIG): the model's forward goes through `fsdp`, `optimizer`
  // steps this rank's pieces, and neither `ddp` nor `sdp` exists.
  std::unique_ptr<parallel::FullyShardedDataParallel> fsdp;
  bool model_state_logged = false;
  std::vector<at::Tensor> trained_parameters; // every group's parameters, for clipping
  std::unique_ptr<optim::LrSchedule> lr_schedule;
  std::unique_ptr<optim::LrSchedule> lr_head_schedule;
  optim::ScheduleOptions lr_options;
  optim::ScheduleOptions lr_head_options;

  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  ProgressBar progress;

  // Where training stands: `epoch` is the epoch in progress (or the next to start) and
  // `iteration_in_epoch` the optimizer steps of it already done (each takes
  // gradient_accumulation_steps batches); `iteration` counts all steps.
  int64_t epoch = 0;
  int64_t iteration_in_epoch = 0;
  int64_t iteration = 0;
  std::optional<double> last_top1;
  std::optional<double> last_top5;
  std::optional<double> best_top1;
  bool complete = false;

  void setup();
  bool resume();
  std::vector<int64_t> train_epoch_order(int64_t epoch) const;
  std::vector<int64_t> test_order() const;
  void set_learning_rates(int64_t epoch, int64_t iteration_in_epoch);
  bool train_epoch(TrainSummary& summary, int64_t& iterations_left);
  float train_step(int64_t num_micro_batches, int64_t& num_images);
  void evaluate();
  void save(const std::string& file_name);
  void log_model_state_bytes();
  at::Tensor forward(const at::Tensor& images);
  std::map<std::string, std::vector<int64_t>> trained_parameter_shapes() const;
  // ZeRO 1-3: the optimizer that steps this rank's pieces of the parameters and which pieces
  // they are (their checkpoint is one shard per rank); none for an unsharded optimizer.
  struct OptimizerPieces {
    optim::Optimizer* base;
    parallel::PieceOwnership ownership;
    const char* type; // "zero" (stages 1-2) or "fsdp"
  };
  std::optional<OptimizerPieces> optimizer_pieces();
  fs::path run_dir() const {
    return options.checkpoint.dir;
  }
};

Trainer::Trainer(TrainerOptions options, std::string effective_config_yaml,
                 std::shared_ptr<comm::ProcessGroup> group)
    : state_(std::make_unique<State>()) {
  state_->options = std::move(options);
  state_->config_yaml = std::move(effective_config_yaml);
  state_->group = group ? std::move(group) : join_world(state_->options.distributed, state_->options.device);
  state_->setup();
}

Trainer::~Trainer() = default;

models::TrunkHeadModel& Trainer::model() {
  return state_->model;
}

std::map<std::string, at::Tensor> Trainer::full_parameters() {
  std::map<std::string, at::Tensor> values;
  for (const auto& item : state_->model->named_parameters(/*recurse=*/true)) {
    if (!state_->fsdp || !item.value().requires_grad()) { // frozen ones are kept whole
      values[item.key()] = item.value().detach().clone();
    }
  }
  if (state_->fsdp) {
    for (auto& [name, value] : state_->fsdp->full_parameters()) {
      values[name] = std::move(value);
    }
  }
  return values;
}

void Trainer::State::setup() {
  tune_malloc_for_tensors();
  if (is_rank0() && fs::is_directory(run_dir())) {
    remove_stale_temporaries(run_dir());
  }
  // 0 = every core, shared among the ranks on this machine (LOCAL_WORLD_SIZE), so that
  // N workers on one node do not oversubscribe it N times.
  int64_t threads = options.num_threads;
  if (threads == 0) {
    auto world = group->world_size() > 1 ? comm::world_from_environment() : std::nullopt;
    const int64_t local_ranks = world ? std::max(1, world->local_world_size) : 1;
    threads = std::max<int64_t>(1, std::max(1u, std::thread::hardware_concurrency()) / local_ranks);
  }
  torch::set_num_threads(static_cast<int>(threads));

  const int rank = group->rank();
  const int world_size = group->world_size();
  if (options.device == "gpu") {
    if (torch::cuda::is_available()) {
      // One GPU per process: the launcher's LOCAL_RANK picks it.
      auto world = comm::world_from_environment();
      const int local_rank = world ? world->local_rank : 0;
      device = torch::Device(torch::kCUDA,
                             static_cast<c10::DeviceIndex>(local_rank % torch::cuda::device_count()));
    } else {
      spdlog::warn("MACHINE.DEVICE is gpu but no CUDA device is visible; training on the CPU");
    }
  }

  // Data first: the model's input shape and class count come from it.
  train_data = load_dataset(options.train, data::Split::kTrain, options.seed);
  test_data = load_dataset(options.test, data::Split::kTest, options.seed + 1);
  train_subset = subset_indices(train_data->size(), options.train);
  test_subset = subset_indices(test_data->size(), options.test);
  const SplitFacts train_facts = split_facts("DATA.TRAIN", options.train, *train_data,
                                             static_cast<int64_t>(train_subset.size()));
  std::optional<SplitFacts> test_facts;
  if (options.test_model) {
    test_facts = split_facts("DATA.TEST", options.test, *test_data,
                             static_cast<int64_t>(test_subset.size()));
  }
  check_data_fits_model(train_facts, test_facts, options.model.trunk_name);

  auto make_loader = [&](const DataSplitOptions& split, const std::shared_ptr<const data::Dataset>& dataset) {
    data::DataLoaderOptions loader_options;
    loader_options.batch_size = split.batch_size;
    loader_options.num_workers = options.num_dataloader_workers;
    loader_options.drop_last = split.drop_last;
    loader_options.transforms = data::make_pipeline(split.transforms);
    loader_options.seed = loader_seed(options.seed, rank);
    return std::make_unique<data::DataLoader>(dataset, loader_options);
  };
  train_loader = make_loader(options.train, train_data);
  test_loader = make_loader(options.test, test_data);
  // Every rank reads the same number of samples per epoch (the samplers pad or drop to
  // make it so), hence takes the same number of steps: the collectives stay paired.
  const int64_t samples_per_rank = static_cast<int64_t>(train_epoch_order(0).size());
  const int64_t batches_per_epoch = options.train.drop_last
      ? samples_per_rank / options.train.batch_size
      : (samples_per_rank + options.train.batch_size - 1) / options.train.batch_size;
  const int64_t accumulation = options.gradient_accumulation_steps;
  iterations_per_epoch = (batches_per_epoch + accumulation - 1) / accumulation;
  if (iterations_per_epoch == 0) {
    throw ConfigError(fmt::format(
        "DATA.TRAIN.BATCHSIZE_PER_REPLICA = {} with DROP_LAST = True leaves no batch from the {} "
        "samples each of the {} ranks reads",
        options.train.batch_size, samples_per_rank, world_size));
  }

  // Model: initialized from SEED_VALUE so every run (and every rank) starts the same.
  auto sample_shape = train_facts.input_shape; // [C, H, W] after DATA.TRAIN.TRANSFORMS
  models::ModelOptions model_options = options.model;
  if (model_options.in_channels == 0) {
    model_options.in_channels = sample_shape[0];
  }
  if (model_options.image_size == 0) {
    model_options.image_size = sample_shape[1];
  }
  if (model_options.num_classes == 0) {
    model_options.num_classes = train_data->num_classes();
  }
  seed_everything(options.seed);
  model = models::build_model(model_options);
  model->to(device);
  if (options.activation_checkpointing.enabled) {
    // Before DDP exists: the probe steps must not fire its gradient hooks.
    checkpointed_trunk = parallel::CheckpointedTrunk::plan(
        model, parallel::TrunkCheckpointingOptions(options.activation_checkpointing.num_splits),
        sample_shape);
    spdlog::info("activation checkpointing: {}", checkpointed_trunk->describe());
    if (auto report = parallel::measure_activation_memory(*checkpointed_trunk, sample_shape,
                                                          options.train.batch_size)) {
      spdlog::info("activation checkpointing: {}", report->describe());
      step_memory.emplace(device);
    }
  }
  // Mixed precision casts the model (O2/O3) before DDP sizes its gradient buckets by dtype;
  // found_inf is all-reduced so every rank skips (or stops) together.
  precision::apply_tf32(options.tf32);
  precision::GradScalerOptions scaler_options = options.grad_scaler;
  if (world_size > 1) {
    scaler_options.found_inf_reducer = precision::found_inf_all_reduce(group);
  }
  precision::PrecisionPolicy precision_policy = precision::resolve_precision_policy(options.amp);
  if (options.fsdp.compute_copies()) {
    // FSDP casts its gathered units and the inputs (as Apex O2 casts the model), and its
    // float32 shards are the master weights: no autocast, no model cast; the loss scaling
    // stays the dtype's (dynamic for float16).
    precision_policy.opt_level = precision::OptLevel::kO2;
    precision_policy.autocast = false;
  }
  if (world_size > 1) {
    precision::check_policy_supported_by_backend(precision_policy, group->backend());
  }
  if (options.zero.shard_optimizer_state && precision_policy.master_weights) {
    throw ConfigError(fmt::format(
        "ZeRO (OPTIMIZER.name zero / use_zero / SHARDED_DDP_SETUP.USE_SDP) with {} is not "
        "supported yet: sharding float32 master weights is not built. Use opt_level O1 "
        "(autocast, float32 weights) or O3 with ZeRO, or turn ZeRO off",
        precision_policy.describe()));
  }
  if (options.fsdp.enabled) {
    check_fsdp_supported(options, precision_policy);
  }
  mixed_precision = std::make_unique<precision::MixedPrecision>(
      precision_policy, *model, device, scaler_options, options.check_nan);

  // Optimizer (ZeRO: sharded, see docs/zero.md). Built before DDP/SDP: the sharded optimizer
  // moves the parameters into flat buffers, and SDP reduces into its gradient shards.
  const auto& opt = options.optimizer;
  optim::OptimizerSpec spec = opt.spec;
  if (spec.use_larc && opt.larc_exclude_bias_and_norm) {
    for (auto& name : optim::bias_and_norm_parameter_names(*model, opt.param_groups.is_norm_layer)) {
      spec.larc.excluded_from_adaptation.insert(std::move(name));
    }
  }
  auto param_groups = optim::build_param_groups(*model, opt.param_groups);
  for (auto& param_group : param_groups) { // O2: the optimizer updates the float32 master weights
    for (size_t i = 0; i < param_group.params.size(); ++i) {
      param_group.params[i] =
          mixed_precision->optimizer_param(param_group.names[i], param_group.params[i]);
    }
  }
  auto make_base_optimizer = [spec](std::vector<optim::ParamGroup> groups) {
    return optim::make_optimizer(std::move(groups), spec);
  };
  if (options.fsdp.enabled) {
    fsdp = std::make_unique<parallel::FullyShardedDataParallel>(model, group,
                                                                fully_sharded_options(options));
    optimizer = fsdp->make_optimizer(param_groups, make_base_optimizer);
  } else if (options.zero.shard_optimizer_state) {
    parallel::ShardedOptimizerOptions zero_options;
    zero_options.make_base_optimizer = make_base_optimizer;
    auto zero = std::make_unique<parallel::ShardedOptimizer>(std::move(param_groups), group,
                                                             zero_options);
    sharded_optimizer = zero.get();
    optimizer = std::move(zero);
  } else {
    optimizer = make_base_optimizer(std::move(param_groups));
  }
  for (const auto& group : optimizer->param_groups()) {
    trained_parameters.insert(trained_parameters.end(), group.params.begin(), group.params.end());
  }
  if (fsdp) {
    // Reduces its own gradients (reduce-scatter per unit).
  } else if (world_size > 1 && options.zero.shard_gradients) {
    parallel::ShardedDataParallelOptions sdp_options;
    sdp_options.reduce_buffer_bytes =
        options.zero.reduce_buffer_elements * static_cast<int64_t>(sizeof(float));
    sdp_options.broadcast_buffers = options.distributed.broadcast_buffers;
    sdp_options.find_unused_parameters = options.distributed.find_unused_parameters;
    sdp = std::make_unique<parallel::ShardedDataParallel>(model.ptr(), *sharded_optimizer, group,
                                                          sdp_options);
  } else if (world_size > 1) {
    parallel::DistributedDataParallelOptions ddp_options;
    ddp_options.bucket_cap_bytes = options.distributed.bucket_cap_mb * 1024 * 1024;
    ddp_options.broadcast_buffers = options.distributed.broadcast_buffers;
    ddp_options.delay_allreduce = options.distributed.delay_allreduce;
    ddp_options.manual_reduction = options.distributed.manual_gradient_reduction;
    ddp_options.find_unused_parameters = options.distributed.find_unused_parameters;
    ddp = std::make_unique<parallel::DistributedDataParallel>(model.ptr(), group, ddp_options);
  }
  // Dropout streams differ per rank (as VISSL seeds SEED_VALUE + rank); rank 0 keeps SEED_VALUE.
  seed_everything(options.seed + static_cast<uint64_t>(rank));
  mixed_precision->copy_model_to_masters(); // DDP broadcast rank 0's weights (O2)

  const int64_t global_batch = options.train.batch_size * world_size * accumulation;
  lr_options = opt.lr;
  optim::apply_auto_lr_scaling(lr_options, opt.lr_scaling, global_batch, global_batch);
  lr_schedule = optim::make_schedule(lr_options);
  lr_head_options = opt.head_use_different_lr ? opt.lr_head : lr_options;
  if (opt.head_use_different_lr) {
    optim::apply_auto_lr_scaling(lr_head_options, opt.lr_head_scaling, global_batch, global_batch);
  }
  lr_head_schedule = optim::make_schedule(lr_head_options);

  if (is_rank0()) {
    fs::create_directories(run_dir());
    if (!config_yaml.empty()) {
      write_file_atomically(run_dir() / "train_config.yaml", config_yaml);
    }
    metrics = std::make_unique<MetricsWriter>(run_dir() / "metrics.jsonl");
    if (options.use_tensorboard) {
      tensorboard = std::make_unique<TensorBoardWriter>(run_dir() / "tb_logs");
    }
  }
  spdlog::info("model {}: {} parameters; {} training samples, {} test samples; {} iterations/epoch; "
               "{} threads on {}; precision {}",
               model_options.trunk_name, models::count_parameters(*model), train_subset.size(),
               test_subset.size(), iterations_per_epoch, threads, device.str(),
               mixed_precision->policy().describe());
  if (world_size > 1) {
    spdlog::info("data parallel: {} ranks ({}), global batch {} = {} per rank x {} ranks x {} "
                 "accumulation steps; {}",
                 world_size, group->backend(), global_batch, options.train.batch_size, world_size,
                 accumulation,
                 fsdp ? fmt::format("{} FSDP units", fsdp->units().size())
                      : fmt::format("{} gradient buckets",
                                    ddp ? ddp->num_buckets() : sdp->num_buckets()));
  }
  if (fsdp) {
    log_fsdp_units(*fsdp, spec);
  }
  if (sharded_optimizer) {
    spdlog::info("ZeRO stage {}: optimizer state{} sharded over {} rank(s) (base optimizer {}{})",
                 sdp ? 2 : 1, sdp ? " and gradients" : "", world_size, spec.name,
                 spec.use_larc ? " with LARC" : "");
  }
}

// This rank's positions into train_subset for `epoch`, mapped to dataset indices.
std::vector<int64_t> Trainer::State::train_epoch_order(int64_t epoch_index) const {
  const auto size = static_cast<int64_t>(train_subset.size());
  std::vector<int64_t> positions;
  if (options.train.use_stateful_sampler) {
    data::StatefulDistributedSampler sampler(size, group->world_size(), group->rank(),
                                             options.train.batch_size, options.seed);
    sampler.set_epoch(epoch_index);
    positions = sampler.epoch_indices();
  } else {
    data::DistributedSampler sampler(size, group->world_size(), group->rank(), /*shuffle=*/true,
                                     options.seed, options.train.drop_last);
    sampler.set_epoch(epoch_index);
    positions = sampler.indices();
  }
  for (auto& position : positions) {
    position = train_subset[position];
  }
  return positions;
}

// This rank's share of the test set: every world_size-th sample from its rank on, with no
// padding, so each sample is evaluated exactly once and the summed counts are exact.
std::vector<int64_t> Trainer::State::test_order() const {
  std::vector<int64_t> order;
  for (size_t i = static_cast<size_t>(group->rank()); i < test_subset.size();
       i += static_cast<size_t>(group->world_size())) {
    order.push_back(test_subset[i]);
  }
  return order;
}

void Trainer::State::set_learning_rates(int64_t epoch_index, int64_t batch_index) {
  const int64_t num_epochs = options.optimizer.num_epochs;
  double trunk_where = optim::where_for(epoch_index, batch_index, iterations_per_epoch, num_epochs,
                                        lr_options.update_interval);
  double head_where = optim::where_for(epoch_index, batch_index, iterations_per_epoch, num_epochs,
                                       lr_head_options.update_interval);
  double trunk_lr = lr_schedule->value_at(std::min(trunk_where, 1.0));
  double head_lr = lr_head_schedule->value_at(std::min(head_where, 1.0));
  for (auto& group : optimizer->param_groups()) {
    group.lr = group.name.rfind("head", 0) == 0 ? head_lr : trunk_lr; // "head", "head_no_wd"
  }
}

bool Trainer::State::resume() {
  if (!options.checkpoint.auto_resume) {
    if (is_rank0()) {
      prepare_fresh_start(run_dir(), options.checkpoint.overwrite_existing);
    }
    group->barrier();
    return false;
  }
  auto choice = choose_resume_checkpoint(run_dir());
  if (!choice) {
    return false;
  }
  if (!choice->warning.empty() && is_rank0()) {
    spdlog::warn("{}", choice->warning);
  }
  const fs::path latest = choice->path;
  auto& state = choice->state;
  auto entry = [&](const char* key) -> const c10::IValue& {
    return checkpoint::state_at(state, key, latest.string());
  };
  if (entry("complete").toBool() && options.checkpoint.overwrite_existing) {
    spdlog::info("{} is a final checkpoint; CHECKPOINT.OVERWRITE_EXISTING is set, so training "
                 "starts again from scratch",
                 fs::canonical(latest).string());
    if (is_rank0()) {
      prepare_fresh_start(run_dir(), /*overwrite_existing=*/true);
    }
    group->barrier();
    return false;
  }
  const auto model_state = entry("model").toGenericDict();
  if (fsdp) { // each rank keeps its shard of the whole values
    checkpoint::check_model_state_dict(*model, model_state,
                                       /*exact_floating_dtypes=*/!fsdp->options().compute_dtype,
                                       latest.string());
    std::unordered_map<std::string, at::Tensor> values;
    for (const auto& item : model_state) {
      values.emplace(item.key().toStringRef(), item.value().toTensor());
    }
    fsdp->load_full_state(values);
  } else {
    checkpoint::load_model_state_dict(*model, model_state, latest.string());
  }
  auto precision_state = state.find("precision"); // absent in checkpoints of Largo 0.1.0
  mixed_precision->load_state_dict(precision_state == state.end() ? c10::IValue()
                                                                  : precision_state->value());
  const fs::path checkpoint_dir = fs::canonical(latest).parent_path();
  if (auto pieces = optimizer_pieces()) {
    load_piece_optimizer_state(checkpoint_dir, entry("optimizer"), *pieces->base,
                               pieces->ownership, trained_parameter_shapes());
  } else {
    load_optimizer_state(checkpoint_dir, entry("optimizer"), *optimizer,
                         trained_parameter_shapes());
  }
  epoch = entry("epoch").toInt();
  iteration_in_epoch = entry("iteration_in_epoch").toInt();
  iteration = entry("iteration").toInt();
  complete = entry("complete").toBool();
  int64_t saved_iterations_per_epoch = entry("iterations_per_epoch").toInt();
  const int64_t saved_world_size = state.contains("world_size") ? entry("world_size").toInt() : 1;
  if (iteration_in_epoch > 0 && (saved_iterations_per_epoch != iterations_per_epoch ||
                                 saved_world_size != group->world_size())) {
    throw CheckpointError(fmt::format(
        "{} was written mid-epoch by {} rank(s) with {} iterations per epoch, but this run has {} "
        "rank(s) and {} iterations per epoch (world size, batch size, accumulation or data "
        "changed), so the rest of that epoch cannot be served exactly; resume with the original "
        "settings, or from an end-of-epoch checkpoint (model_phase*.torch)",
        latest.string(), saved_world_size, saved_iterations_per_epoch, group->world_size(),
        iterations_per_epoch));
  }
  // Each rank continues its own random stream; with another world size there is none to
  // continue, so ranks re-seed from the seed, their rank and the iteration.
  if (state.contains("rng_states") && saved_world_size == group->world_size()) {
    set_cpu_rng_state(entry("rng_states").toTensor()[group->rank()].contiguous());
  } else if (group->world_size() == 1) {
    set_cpu_rng_state(entry("rng_state").toTensor());
  } else {
    seed_everything(options.seed + static_cast<uint64_t>(group->rank()) +
                    static_cast<uint64_t>(iteration) * 1000003u);
  }
  auto optional_double = [&](const char* key) -> std::optional<double> {
    auto it = state.find(key);
    if (it == state.end() || it->value().isNone()) {
      return std::nullopt;
    }
    return it->value().toDouble();
  };
  last_top1 = optional_double("top1");
  last_top5 = optional_double("top5");
  best_top1 = optional_double("best_top1");
  spdlog::info("resumed from {} (epoch {}, iteration {} of the epoch, {} iterations in all)",
               fs::canonical(latest).string(), epoch, iteration_in_epoch, iteration);
  return true;
}

void Trainer::State::save(const std::string& file_name) {
  // Collective: every rank contributes its RNG state, so a resumed run continues each
  // rank's dropout stream (rank 0 alone writes the file).
  at::Tensor own_rng = cpu_rng_state();
  at::Tensor rng_states = at::empty({group->world_size(), own_rng.numel()}, own_rng.options());
  group->all_gather(rng_states, own_rng);
  // ZeRO: each rank writes its own optimizer shard (collective), the main file refers to them.
  c10::IValue optimizer_state;
  if (auto pieces = optimizer_pieces()) {
    optimizer_state = save_optimizer_shards(
        run_dir(), file_name,
        parallel::piece_state_dict(*pieces->base, pieces->ownership, pieces->type), *group);
  } else {
    optimizer_state = optimizer->state_dict();
  }
  // FSDP: the whole model, gathered one unit at a time onto rank 0 (collective).
  const auto fsdp_model_state =
      fsdp ? fsdp->full_state_on_rank(0) : std::vector<std::pair<std::string, at::Tensor>>();
  if (!is_rank0()) {
    return;
  }
  auto state = checkpoint::make_state_dict();
  if (fsdp) {
    checkpoint::StateDict model_state(c10::StringType::get(), c10::TensorType::get());
    for (const auto& [name, tensor] : fsdp_model_state) {
      model_state.insert(name, tensor);
    }
    state.insert("model", model_state);
  } else {
    state.insert("model", checkpoint::model_state_dict(*model));
  }
  state.insert("optimizer", optimizer_state);
  state.insert("precision", mixed_precision->state_dict()); // loss scale, fp32 master weights
  state.insert("epoch", epoch);
  state.insert("iteration_in_epoch", iteration_in_epoch);
  state.insert("iteration", iteration);
  state.insert("iterations_per_epoch", iterations_per_epoch);
  state.insert("num_epochs", options.optimizer.num_epochs);
  state.insert("complete", complete);
  state.insert("rng_state", own_rng);
  state.insert("rng_states", rng_states);
  state.insert("world_size", static_cast<int64_t>(group->world_size()));
  // Where the training sampler stands, in VISSL's terms (informational: the position is
  // epoch and iteration_in_epoch, from which every rank recomputes its order).
  auto sampler = checkpoint::make_state_dict();
  sampler.insert("type", std::string(options.train.use_stateful_sampler
                                         ? "StatefulDistributedSampler"
                                         : "DistributedSampler"));
  sampler.insert("epoch", epoch);
  sampler.insert("start_iter", iteration_in_epoch * options.gradient_accumulation_steps);
  sampler.insert("batch_size", options.train.batch_size);
  sampler.insert("num_replicas", static_cast<int64_t>(group->world_size()));
  state.insert("train_sampler", sampler);
  state.insert("top1", last_top1 ? c10::IValue(*last_top1) : c10::IValue());
  state.insert("top5", last_top5 ? c10::IValue(*last_top5) : c10::IValue());
  state.insert("best_top1", best_top1 ? c10::IValue(*best_top1) : c10::IValue());
  state.insert("largo_version", std::string(kLargoVersion));
  state.insert("config", config_yaml);
  const fs::path path = run_dir() / file_name;
  checkpoint::save_checkpoint(path, state);
  // Point checkpoint.torch at the new file: a symlink made aside and renamed over the
  // old one, so the name always refers to a complete checkpoint.
  const fs::path latest = run_dir() / kLatestCheckpointName;
  const fs::path temporary = run_dir() / (std::string(kLatestCheckpointName) + ".tmp");
  fs::remove(temporary);
  fs::create_symlink(file_name, temporary);
  fs::rename(temporary, latest);
  spdlog::info("checkpoint written: {}", path.string());
}

std::optional<Trainer::State::OptimizerPieces> Trainer::State::optimizer_pieces() {
  if (sharded_optimizer) {
    return OptimizerPieces{&sharded_optimizer->base(), sharded_optimizer->piece_ownership(),
                           "zero"};
  }
  if (fsdp) {
    return OptimizerPieces{optimizer.get(), fsdp->piece_ownership(), "fsdp"};
  }
  return std::nullopt;
}

std::map<std::string, std::vector<int64_t>> Trainer::State::trained_parameter_shapes() const {
  std::map<std::string, std::vector<int64_t>> shapes;
  if (fsdp) { // the optimizer's groups hold 1-D pieces; the model keeps the shapes
    for (const auto& item : model->named_parameters(/*recurse=*/true)) {
      if (item.value().requires_grad()) {
        shapes[item.key()] = item.value().sizes().vec();
      }
    }
    return shapes;
  }
  for (const auto& param_group : optimizer->param_groups()) {
    for (size_t i = 0; i < param_group.params.size(); ++i) {
      shapes[param_group.names.at(i)] = param_group.params[i].sizes().vec();
    }
  }
  return shapes;
}

// What this rank holds of the model state (parameters, gradients, optimizer state), next to
// the estimate `largo estimate` prints for the same run (docs/zero_memory.md), logged once
// so a user sees what ZeRO saves and that the estimate holds.
void Trainer::State::log_model_state_bytes() {
  model_state_logged = true;
  const parallel::ModelStateBytes measured = fsdp
      ? parallel::measure_model_state_bytes(*fsdp, *optimizer)
      : parallel::measure_model_state_bytes(*model, *optimizer);
  parallel::MemoryEstimateOptions estimate_options;
  estimate_options.optimizer = options.optimizer.spec;
  estimate_options.world_size = group->world_size();
  estimate_options.rank = group->rank();
  estimate_options.stage = fsdp ? 3 : sdp ? 2 : sharded_optimizer ? 1 : 0;
  // O2: the optimizer's groups hold the float32 masters, which are not the model's tensors.
  const bool masters = mixed_precision->master_weights() != nullptr;
  if (masters) {
    estimate_options.master_weights_dtype = at::kFloat;
  }
  std::vector<parallel::ParameterSize> sizes = masters || fsdp
      ? parallel::parameter_sizes(*model)
      : parallel::parameter_sizes(*model, optimizer->param_groups());
  if (fsdp && fsdp->options().compute_dtype) {
    for (auto& size : sizes) { // the model's parameters are views of the compute copies
      if (size.trained) {
        size.dtype = fsdp->units().front().shard.scalar_type();
      }
    }
  }
  const parallel::ModelStateBytes estimated =
      parallel::estimate_model_state_bytes(sizes, estimate_options);
  constexpr double kMiB = 1024.0 * 1024.0;
  spdlog::info("model state on rank {} (ZeRO stage {}), measured / estimated: parameters "
               "{:.2f} / {:.2f} MiB, gradients {:.2f} / {:.2f} MiB, optimizer state {:.2f} / "
               "{:.2f} MiB",
               group->rank(), estimate_options.stage, measured.parameters / kMiB,
               estimated.parameters / kMiB, measured.gradients / kMiB, estimated.gradients / kMiB,
               measured.optimizer_state / kMiB, estimated.optimizer_state / kMiB);
  if (fsdp) {
    spdlog::info("FSDP on rank {}: at most {:.2f} MiB of full units gathered at once during the "
                 "first step (transient, on top of the model state)",
                 group->rank(), fsdp->peak_gathered_bytes() / kMiB);
  }
}

at::Tensor Trainer::State::forward(const at::Tensor& images) {
  if (fsdp && checkpointed_trunk) { // the recompute gathers each unit again
    return fsdp->forward(images, [this](const at::Tensor& x,
                                        const parallel::TrunkBlockRunner& run_blocks) {
      return checkpointed_trunk->forward_trunk(x, run_blocks);
    });
  }
  if (fsdp) {
    return fsdp->forward(images);
  }
  return checkpointed_trunk ? checkpointed_trunk->forward(images) : model->forward(images);
}

// One optimizer step over `num_micro_batches` batches from the loader: their gradients are
// summed (each loss divided by the count, so the step equals one batch of them all), and
// under DDP only the last backward communicates. Returns the mean loss.
float Trainer::State::train_step(int64_t num_micro_batches, int64_t& num_images) {
  optimizer->zero_grad();
  if (step_memory) {
    step_memory->start_window();
  }
  float loss_sum = 0.0f;
  float non_finite_loss = 0.0f; // the first inf/NaN loss of this step on this rank, if any
  for (int64_t micro = 0; micro < num_micro_batches; ++micro) {
    auto batch = train_loader->next();
    TORCH_INTERNAL_ASSERT(batch.has_value(), "the loader ran out inside an optimizer step");
    at::Tensor images = batch->images.to(device, /*non_blocking=*/true);
    at::Tensor labels = batch->labels.to(device, /*non_blocking=*/true);
    const bool last_micro = micro + 1 == num_micro_batches;
    std::optional<parallel::DistributedDataParallel::NoSyncGuard> no_sync;
    if (ddp && !last_micro) {
      no_sync.emplace(*ddp);
    }
    at::Tensor logits = mixed_precision->forward( // autocast / input cast per MODEL.AMP_PARAMS
        [&](const at::Tensor& x) {
          if (ddp) {
            ddp->before_forward();
          } else if (sdp) {
            sdp->before_forward();
          }
          return forward(x);
        },
        images);
    at::Tensor loss = torch::nn::functional::cross_entropy(
        logits, labels,
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(options.loss_ignore_index));
    const float loss_value = loss.item<float>();
    // Not thrown here: the ranks decide together after backward (unscale_ below), so that
    // a NaN on one rank stops (or, with loss scaling, skips) every rank at the same step.
    if (!std::isfinite(loss_value) && std::isfinite(non_finite_loss)) {
      non_finite_loss = loss_value;
    }
    // Loss scaling: backward on the scaled loss (MixedPrecision::backward).
    mixed_precision->backward(num_micro_batches > 1 ? loss / static_cast<double>(num_micro_batches)
                                                    : loss);
    loss_sum += loss_value;
    num_images += images.size(0);
  }
  if (step_memory) {
    const int64_t peak = step_memory->window_peak_bytes();
    if (!logged_first_step_memory) {
      spdlog::info("activation checkpointing: peak memory of the first step of this run, "
                   "gradients included: {} (measured)",
                   format_bytes(peak));
      logged_first_step_memory = true;
    }
    window_step_peak_bytes = std::max(window_step_peak_bytes, peak);
  }
  if (ddp && options.distributed.manual_gradient_reduction) {
    ddp->reduce_gradients();
  }
  // unscale_ (O2: into the float32 masters) before clipping, found_inf agreed on by every
  // rank; the step is skipped (loss scaling) or the run stops (no scaling) on inf/NaN.
  const bool loss_finite = std::isfinite(non_finite_loss) || !options.check_nan;
  // ZeRO: each rank unscales and checks only the gradients its shard steps with.
  const bool gradients_finite = mixed_precision->unscale_(
      sharded_optimizer ? sharded_optimizer->shard_parameters() : trained_parameters, loss_finite);
  if (!gradients_finite && !mixed_precision->has_loss_scaling()) {
    progress.clear();
    const std::string where = fmt::format(
        "at epoch {} iteration {} (global iteration {}{})", epoch + 1, iteration_in_epoch + 1,
        iteration + 1,
        group->world_size() > 1 ? fmt::format(", rank {} of {}", group->rank(), group->world_size())
                                : "");
    const std::string what = !loss_finite
        ? fmt::format("the training loss is {} {}", non_finite_loss, where)
        : fmt::format("a gradient is inf or NaN {} (on this rank or another)", where);
    throw TrainingError(fmt::format(
        "{}; training stopped without writing a checkpoint, so {} still holds the last good "
        "state. Lower the learning rate or check the data, then resume.",
        what, (run_dir() / kLatestCheckpointName).string()));
  }
  if (gradients_finite && options.use_grad_clip) { // after unscale_, before LARC
    if (sharded_optimizer) { // the norm over every rank's shard (a collective)
      sharded_optimizer->clip_grad_norm(options.grad_clip_max_norm, options.grad_clip_norm_type);
    } else if (fsdp) {
      fsdp->clip_grad_norm(options.grad_clip_max_norm, options.grad_clip_norm_type);
    } else {
      optim::clip_grad_norm(trained_parameters, options.grad_clip_max_norm,
                            options.grad_clip_norm_type);
    }
  }
  try {
    mixed_precision->step([&] { optimizer->step(); });
  } catch (const TrainingError& error) { // the loss scale cannot back off any further
    progress.clear();
    throw TrainingError(fmt::format("at epoch {} iteration {} (global iteration {}): {}",
                                    epoch + 1, iteration_in_epoch + 1, iteration + 1,
                                    error.what()));
  }
  if (!model_state_logged) {
    log_model_state_bytes(); // after the first step, when the optimizer state exists
  }
  return loss_sum / static_cast<float>(num_micro_batches);
}

bool Trainer::State::train_epoch(TrainSummary& summary, int64_t& iterations_left) {
  const int64_t num_epochs = options.optimizer.num_epochs;
  const int64_t accumulation = options.gradient_accumulation_steps;
  model->train();
  train_loader->start_epoch(train_epoch_order(epoch), epoch, iteration_in_epoch * accumulation);

  auto window_start = std::chrono::steady_clock::now();
  int64_t window_images = 0;
  double window_loss = 0.0;
  int64_t window_steps = 0;
  while (iteration_in_epoch < iterations_per_epoch) {
    set_learning_rates(epoch, iteration_in_epoch);
    // The last step of an epoch takes what is left when the batches do not divide evenly.
    const int64_t batches_left = train_loader->num_batches() - train_loader->next_batch_index();
    const float loss_value = train_step(std::min(accumulation, batches_left), window_images);

    ++iteration;
    ++iteration_in_epoch;
    summary.iteration_losses.push_back(loss_value);
    window_loss += loss_value;
    ++window_steps;

    const double lr = optimizer->param_groups().front().lr;
    if (iteration % options.log_frequency == 0 || iteration_in_epoch == iterations_per_epoch) {
      // The mean loss and the images of all ranks (a collective, at the same iterations on
      // every rank).
      at::Tensor totals = at::tensor({window_loss, static_cast<double>(window_images)}, at::kDouble);
      group->all_reduce(totals);
      const double seconds = seconds_since(window_start);
      const double images_per_sec = seconds > 0 ? totals[1].item<double>() / seconds : 0.0;
      const double seconds_per_iteration = seconds / std::max<int64_t>(window_steps, 1);
      const int64_t remaining = num_epochs * iterations_per_epoch - iteration;
      const double mean_loss =
          totals[0].item<double>() / std::max<int64_t>(window_steps, 1) / group->world_size();
      progress.clear();
      nlohmann::json event = {{"phase", "train"}, {"epoch", epoch}, {"iteration", iteration},
                              {"loss", mean_loss}, {"lr", lr}, {"images_per_sec", images_per_sec},
                              {"wall_time", wall_time()}};
      std::string scaling;
      if (mixed_precision->has_loss_scaling()) {
        event["loss_scale"] = mixed_precision->loss_scale();
        event["skipped_steps"] = mixed_precision->skipped_steps(); // since the run started
        scaling = fmt::format(" loss scale {:g} skipped steps {}", mixed_precision->loss_scale(),
                              mixed_precision->skipped_steps());
      }
      spdlog::info("train epoch {}/{} iter {}/{} loss {:.4f} lr {:.5g}{} {:.0f} img/s eta {}",
                   epoch + 1, num_epochs, iteration_in_epoch, iterations_per_epoch, mean_loss, lr,
                   scaling, images_per_sec, format_duration(remaining * seconds_per_iteration));
      if (metrics) {
        if (step_memory) {
          event["step_peak_bytes"] = window_step_peak_bytes; // this rank's (rank 0's)
        }
        metrics->write(event);
      }
      if (tensorboard && mixed_precision->has_loss_scaling()) {
        tensorboard->add_scalar("train/loss_scale", mixed_precision->loss_scale(), iteration);
      }
      window_step_peak_bytes = 0;
      if (tensorboard) {
        tensorboard->add_scalar("train/loss", mean_loss, iteration);
        tensorboard->add_scalar("train/lr", lr, iteration);
        tensorboard->add_scalar("train/images_per_sec", images_per_sec, iteration);
      }
      window_start = std::chrono::steady_clock::now();
      window_images = 0;
      window_loss = 0.0;
      window_steps = 0;
    }
    if (is_rank0()) {
      progress.update(iteration_in_epoch, iterations_per_epoch,
                      fmt::format("epoch {}/{} loss {:.4f}", epoch + 1, num_epochs, loss_value));
    }

    if (options.checkpoint.frequency_iterations > 0 &&
        iteration % options.checkpoint.frequency_iterations == 0 &&
        iteration_in_epoch < iterations_per_epoch) {
      progress.clear();
      save(fmt::format("model_iteration{}.torch", iteration));
    }
    if (iterations_left > 0 && --iterations_left == 0) {
      progress.clear();
      summary.interrupted = true;
      return false;
    }
  }
  progress.clear();
  return true;
}

void Trainer::State::evaluate() {
  model->eval();
  torch::NoGradGuard no_grad;
  AccuracyMeter meter(options.topk_values);
  double loss_sum = 0.0;
  test_loader->start_epoch(test_order(), /*epoch=*/0, /*start_batch=*/0);
  while (auto batch = test_loader->next()) {
    at::Tensor images = batch->images.to(device);
    at::Tensor labels = batch->labels.to(device);
    at::Tensor logits = mixed_precision->forward(
        [&](const at::Tensor& x) { return fsdp ? fsdp->forward(x) : model->forward(x); }, images);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, labels,
                    torch::nn::functional::CrossEntropyFuncOptions()
                        .ignore_index(options.loss_ignore_index)
                        .reduction(torch::kSum))
                    .item<double>();
    meter.update(logits, labels);
  }
  // Every rank evaluated its own share: sum the counts (a collective).
  at::Tensor local_loss = at::tensor({loss_sum}, at::kDouble);
  group->all_reduce(local_loss);
  meter.reduce_over(*group);
  const int64_t num_samples = meter.num_samples();
  auto values = meter.values();
  const auto& ks = meter.topk_values();
  nlohmann::json event = {{"phase", "test"}, {"epoch", epoch}, {"iteration", iteration},
                          {"loss", num_samples > 0 ? local_loss.item<double>() / num_samples : 0.0},
                          {"wall_time", wall_time()}};
  std::string line = fmt::format("test epoch {}/{} loss {:.4f}", epoch + 1,
                                 options.optimizer.num_epochs, event["loss"].get<double>());
  last_top1.reset();
  last_top5.reset();
  for (size_t i = 0; i < ks.size(); ++i) {
    const std::string name = fmt::format("top{}", ks[i]);
    event[name] = values[i];
    line += fmt::format(" {} {:.2f}%", name, values[i]);
    if (ks[i] == 1) {
      last_top1 = values[i];
    }
    if (ks[i] == 5) {
      last_top5 = values[i];
    }
    if (tensorboard) {
      tensorboard->add_scalar("test/" + name, values[i], iteration);
    }
  }
  if (last_top1 && (!best_top1 || *last_top1 > *best_top1)) {
    best_top1 = last_top1;
  }
  spdlog::info("{}", line);
  if (metrics) {
    metrics->write(event);
  }
  if (tensorboard) {
    tensorboard->add_scalar("test/loss", event["loss"].get<double>(), iteration);
    tensorboard->flush();
  }
  model->train();
}

TrainSummary Trainer::run() {
  State& s = *state_;
  TrainSummary summary;
  summary.resumed = s.resume();
  if (s.complete) {
    spdlog::info("training is already complete in {} (final checkpoint, {} epochs); set "
                 "CHECKPOINT.OVERWRITE_EXISTING=True to train again",
                 s.run_dir().string(), s.epoch);
    summary.already_complete = true;
  }
  const int64_t num_epochs = s.options.optimizer.num_epochs;
  int64_t iterations_left = s.options.stop_after_iterations;
  while (!s.complete && s.epoch < num_epochs) {
    if (!s.train_epoch(summary, iterations_left)) {
      break; // interrupted (testing aid): as if killed, nothing more is written
    }
    const bool last_epoch = s.epoch + 1 == num_epochs;
    if (s.options.test_model &&
        ((s.epoch + 1) % s.options.test_every_num_epoch == 0 || last_epoch)) {
      s.evaluate();
    }
    ++s.epoch;
    s.iteration_in_epoch = 0;
    s.complete = last_epoch;
    if (last_epoch) {
      s.save(fmt::format("model_final_checkpoint_phase{}.torch", s.epoch - 1));
    } else if (s.epoch % s.options.checkpoint.frequency_epochs == 0) {
      s.save(fmt::format("model_phase{}.torch", s.epoch - 1));
    }
  }
  summary.epochs_completed = s.epoch;
  summary.iterations = s.iteration;
  summary.final_top1 = s.last_top1;
  summary.final_top5 = s.last_top5;
  return summary;
}

} // namespace largo::train
