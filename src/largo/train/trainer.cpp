#include <largo/train/trainer.h>

#include <largo/checkpoint/checkpoint_file.h>
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
#include <largo/optim/adamw.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/checkpointed_trunk.h>
#include <largo/train/accuracy_meter.h>
#include <largo/train/metrics_writer.h>
#include <largo/train/progress_bar.h>
#include <largo/train/tensorboard_writer.h>

#include <fmt/format.h>
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

} // namespace

struct Trainer::State {
  TrainerOptions options;
  std::string config_yaml;
  torch::Device device{torch::kCPU};

  std::shared_ptr<const data::Dataset> train_data;
  std::shared_ptr<const data::Dataset> test_data;
  std::vector<int64_t> train_subset; // dataset indices the sampler's positions map to
  std::vector<int64_t> test_subset;
  std::unique_ptr<data::DataLoader> train_loader;
  std::unique_ptr<data::DataLoader> test_loader;
  int64_t iterations_per_epoch = 0;

  models::TrunkHeadModel model{nullptr};
  // Set when MODEL.ACTIVATION_CHECKPOINTING is on: the model's forward with checkpointed
  // trunk segments, and the tracker that measures each step's peak memory.
  std::optional<parallel::CheckpointedTrunk> checkpointed_trunk;
  std::optional<MemoryTracker> step_memory;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::vector<at::Tensor> trained_parameters; // every group's parameters, for clipping
  std::unique_ptr<optim::LrSchedule> lr_schedule;
  std::unique_ptr<optim::LrSchedule> lr_head_schedule;
  optim::ScheduleOptions lr_options;
  optim::ScheduleOptions lr_head_options;

  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  ProgressBar progress;

  // Where training stands: `epoch` is the epoch in progress (or the next to start) and
  // `iteration_in_epoch` the batches of it already done; `iteration` counts all steps.
  int64_t epoch = 0;
  int64_t iteration_in_epoch = 0;
  int64_t iteration = 0;
  std::optional<double> last_top1;
  std::optional<double> last_top5;
  std::optional<double> best_top1;
  bool complete = false;

  void setup();
  bool resume();
  std::vector<int64_t> epoch_order(const DataSplitOptions& split, const std::vector<int64_t>& subset,
                                   int64_t epoch, bool shuffle) const;
  void set_learning_rates(int64_t epoch, int64_t iteration_in_epoch);
  bool train_epoch(TrainSummary& summary, int64_t& iterations_left);
  void evaluate();
  void save(const std::string& file_name);
  fs::path run_dir() const {
    return options.checkpoint.dir;
  }
};

Trainer::Trainer(TrainerOptions options, std::string effective_config_yaml)
    : state_(std::make_unique<State>()) {
  state_->options = std::move(options);
  state_->config_yaml = std::move(effective_config_yaml);
  state_->setup();
}

Trainer::~Trainer() = default;

models::TrunkHeadModel& Trainer::model() {
  return state_->model;
}

void Trainer::State::setup() {
  tune_malloc_for_tensors();
  int64_t threads = options.num_threads > 0
      ? options.num_threads
      : static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(static_cast<int>(threads));

  if (options.device == "gpu") {
    if (torch::cuda::is_available()) {
      device = torch::Device(torch::kCUDA, 0);
    } else {
      spdlog::warn("MACHINE.DEVICE is gpu but no CUDA device is visible; training on the CPU");
    }
  }

  // Data first: the model's input shape and class count come from it.
  train_data = load_dataset(options.train, data::Split::kTrain, options.seed);
  test_data = load_dataset(options.test, data::Split::kTest, options.seed + 1);
  train_subset = subset_indices(train_data->size(), options.train);
  test_subset = subset_indices(test_data->size(), options.test);

  auto make_loader = [&](const DataSplitOptions& split, const std::shared_ptr<const data::Dataset>& dataset) {
    data::DataLoaderOptions loader_options;
    loader_options.batch_size = split.batch_size;
    loader_options.num_workers = options.num_dataloader_workers;
    loader_options.drop_last = split.drop_last;
    loader_options.transforms = data::make_pipeline(split.transforms);
    loader_options.seed = options.seed;
    return std::make_unique<data::DataLoader>(dataset, loader_options);
  };
  train_loader = make_loader(options.train, train_data);
  test_loader = make_loader(options.test, test_data);
  int64_t num_train = static_cast<int64_t>(train_subset.size());
  iterations_per_epoch = options.train.drop_last
      ? num_train / options.train.batch_size
      : (num_train + options.train.batch_size - 1) / options.train.batch_size;
  if (iterations_per_epoch == 0) {
    throw ConfigError(fmt::format(
        "DATA.TRAIN.BATCHSIZE_PER_REPLICA = {} with DROP_LAST leaves no batch from {} samples",
        options.train.batch_size, num_train));
  }

  // Model: initialized from SEED_VALUE so every run (and every rank) starts the same.
  auto sample_shape = train_data->sample_shape(); // [C, H, W]
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

  // Optimizer and schedules. Auto-scaling uses the global batch (one process for now).
  const auto& opt = options.optimizer;
  auto groups = optim::build_param_groups(*model, opt.param_groups);
  if (opt.name == "sgd") {
    optim::SGDOptions sgd;
    sgd.momentum = opt.momentum;
    sgd.dampening = opt.dampening;
    sgd.nesterov = opt.nesterov;
    optimizer = std::make_unique<optim::SGD>(std::move(groups), sgd);
  } else {
    optim::AdamWOptions adamw;
    adamw.betas = {opt.betas[0], opt.betas[1]};
    adamw.eps = opt.eps;
    adamw.amsgrad = opt.amsgrad;
    optimizer = std::make_unique<optim::AdamW>(std::move(groups), adamw);
  }
  for (const auto& group : optimizer->param_groups()) {
    trained_parameters.insert(trained_parameters.end(), group.params.begin(), group.params.end());
  }
  const int64_t global_batch = options.train.batch_size;
  lr_options = opt.lr;
  optim::apply_auto_lr_scaling(lr_options, opt.lr_scaling, global_batch, global_batch);
  lr_schedule = optim::make_schedule(lr_options);
  lr_head_options = opt.head_use_different_lr ? opt.lr_head : lr_options;
  if (opt.head_use_different_lr) {
    optim::apply_auto_lr_scaling(lr_head_options, opt.lr_head_scaling, global_batch, global_batch);
  }
  lr_head_schedule = optim::make_schedule(lr_head_options);

  fs::create_directories(run_dir());
  if (!config_yaml.empty()) {
    write_file_atomically(run_dir() / "train_config.yaml", config_yaml);
  }
  metrics = std::make_unique<MetricsWriter>(run_dir() / "metrics.jsonl");
  if (options.use_tensorboard) {
    tensorboard = std::make_unique<TensorBoardWriter>(run_dir() / "tb_logs");
  }
  spdlog::info("model {}: {} parameters; {} training samples, {} test samples; {} iterations/epoch; "
               "{} threads on {}",
               model_options.trunk_name, models::count_parameters(*model), train_subset.size(),
               test_subset.size(), iterations_per_epoch, threads, device.str());
}

std::vector<int64_t> Trainer::State::epoch_order(const DataSplitOptions& split,
                                                 const std::vector<int64_t>& subset, int64_t epoch,
                                                 bool shuffle) const {
  const auto size = static_cast<int64_t>(subset.size());
  std::vector<int64_t> positions;
  if (split.use_stateful_sampler) {
    data::StatefulDistributedSampler sampler(size, /*num_replicas=*/1, /*rank=*/0,
                                             split.batch_size, options.seed);
    sampler.set_epoch(epoch);
    positions = sampler.indices();
  } else {
    data::DistributedSampler sampler(size, /*num_replicas=*/1, /*rank=*/0, shuffle, options.seed,
                                     split.drop_last);
    sampler.set_epoch(epoch);
    positions = sampler.indices();
  }
  for (auto& position : positions) {
    position = subset[position];
  }
  return positions;
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
  const fs::path latest = run_dir() / kLatestCheckpointName;
  // symlink_status: a dangling checkpoint.torch is an error to report, not "no checkpoint".
  if (!options.checkpoint.auto_resume || !fs::exists(fs::symlink_status(latest))) {
    return false;
  }
  auto state = checkpoint::load_checkpoint(latest, {"model", "optimizer", "epoch", "iteration"});
  auto entry = [&](const char* key) -> const c10::IValue& {
    return checkpoint::state_at(state, key, latest.string());
  };
  if (entry("complete").toBool() && options.checkpoint.overwrite_existing) {
    spdlog::info("{} is a final checkpoint; CHECKPOINT.OVERWRITE_EXISTING is set, so training "
                 "starts again from scratch",
                 fs::canonical(latest).string());
    return false;
  }
  checkpoint::load_model_state_dict(*model, entry("model").toGenericDict());
  optimizer->load_state_dict(entry("optimizer"));
  epoch = entry("epoch").toInt();
  iteration_in_epoch = entry("iteration_in_epoch").toInt();
  iteration = entry("iteration").toInt();
  complete = entry("complete").toBool();
  int64_t saved_iterations_per_epoch = entry("iterations_per_epoch").toInt();
  if (iteration_in_epoch > 0 && saved_iterations_per_epoch != iterations_per_epoch) {
    throw CheckpointError(fmt::format(
        "{} was written mid-epoch with {} iterations per epoch, but this config has {} (batch "
        "size or data changed); resume with the original DATA settings or start a new "
        "CHECKPOINT.DIR",
        latest.string(), saved_iterations_per_epoch, iterations_per_epoch));
  }
  set_cpu_rng_state(entry("rng_state").toTensor());
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
  auto state = checkpoint::make_state_dict();
  state.insert("model", checkpoint::model_state_dict(*model));
  state.insert("optimizer", optimizer->state_dict());
  state.insert("epoch", epoch);
  state.insert("iteration_in_epoch", iteration_in_epoch);
  state.insert("iteration", iteration);
  state.insert("iterations_per_epoch", iterations_per_epoch);
  state.insert("num_epochs", options.optimizer.num_epochs);
  state.insert("complete", complete);
  state.insert("rng_state", cpu_rng_state());
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

bool Trainer::State::train_epoch(TrainSummary& summary, int64_t& iterations_left) {
  const int64_t num_epochs = options.optimizer.num_epochs;
  model->train();
  auto order = epoch_order(options.train, train_subset, epoch, /*shuffle=*/true);
  train_loader->start_epoch(order, epoch, iteration_in_epoch);

  auto window_start = std::chrono::steady_clock::now();
  int64_t window_images = 0;
  double window_loss = 0.0;
  int64_t window_steps = 0;
  int64_t window_step_peak_bytes = 0;
  while (auto batch = train_loader->next()) {
    set_learning_rates(epoch, iteration_in_epoch);
    at::Tensor images = batch->images.to(device, /*non_blocking=*/true);
    at::Tensor labels = batch->labels.to(device, /*non_blocking=*/true);

    optimizer->zero_grad();
    if (step_memory) {
      step_memory->start_window();
    }
    at::Tensor logits =
        checkpointed_trunk ? checkpointed_trunk->forward(images) : model->forward(images);
    at::Tensor loss = torch::nn::functional::cross_entropy(
        logits, labels,
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(options.loss_ignore_index));
    const float loss_value = loss.item<float>();
    if (options.check_nan && !std::isfinite(loss_value)) {
      progress.clear();
      throw TrainingError(fmt::format(
          "the training loss is {} at epoch {} iteration {} (global iteration {}); training "
          "stopped without writing a checkpoint, so {} still holds the last good state. Lower "
          "the learning rate or check the data, then resume.",
          loss_value, epoch + 1, iteration_in_epoch + 1, iteration + 1,
          (run_dir() / kLatestCheckpointName).string()));
    }
    loss.backward();
    if (step_memory) {
      const int64_t peak = step_memory->window_peak_bytes();
      window_step_peak_bytes = std::max(window_step_peak_bytes, peak);
      if (summary.iteration_losses.empty()) {
        spdlog::info("activation checkpointing: peak memory of the first step of this run, "
                     "gradients included: {} (measured)",
                     format_bytes(peak));
      }
    }
    if (options.use_grad_clip) {
      torch::nn::utils::clip_grad_norm_(trained_parameters, options.grad_clip_max_norm,
                                        options.grad_clip_norm_type);
    }
    optimizer->step();

    ++iteration;
    ++iteration_in_epoch;
    summary.iteration_losses.push_back(loss_value);
    window_loss += loss_value;
    window_images += images.size(0);
    ++window_steps;

    const double lr = optimizer->param_groups().front().lr;
    if (iteration % options.log_frequency == 0 || iteration_in_epoch == iterations_per_epoch) {
      double seconds = seconds_since(window_start);
      double images_per_sec = seconds > 0 ? window_images / seconds : 0.0;
      double seconds_per_iteration = seconds / std::max<int64_t>(window_steps, 1);
      int64_t remaining = num_epochs * iterations_per_epoch - iteration;
      double mean_loss = window_loss / std::max<int64_t>(window_steps, 1);
      progress.clear();
      spdlog::info("train epoch {}/{} iter {}/{} loss {:.4f} lr {:.5g} {:.0f} img/s eta {}",
                   epoch + 1, num_epochs, iteration_in_epoch, iterations_per_epoch, mean_loss, lr,
                   images_per_sec, format_duration(remaining * seconds_per_iteration));
      nlohmann::json event = {{"phase", "train"}, {"epoch", epoch}, {"iteration", iteration},
                              {"loss", mean_loss}, {"lr", lr}, {"images_per_sec", images_per_sec},
                              {"wall_time", wall_time()}};
      if (step_memory) {
        event["step_peak_bytes"] = window_step_peak_bytes;
        window_step_peak_bytes = 0;
      }
      metrics->write(event);
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
    progress.update(iteration_in_epoch, iterations_per_epoch,
                    fmt::format("epoch {}/{} loss {:.4f}", epoch + 1, num_epochs, loss_value));

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
  int64_t num_samples = 0;
  auto order = epoch_order(options.test, test_subset, /*epoch=*/0, /*shuffle=*/false);
  test_loader->start_epoch(order, /*epoch=*/0, /*start_batch=*/0);
  while (auto batch = test_loader->next()) {
    at::Tensor images = batch->images.to(device);
    at::Tensor labels = batch->labels.to(device);
    at::Tensor logits = model->forward(images);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, labels,
                    torch::nn::functional::CrossEntropyFuncOptions()
                        .ignore_index(options.loss_ignore_index)
                        .reduction(torch::kSum))
                    .item<double>();
    num_samples += labels.size(0);
    meter.update(logits, labels);
  }
  auto values = meter.values();
  const auto& ks = meter.topk_values();
  nlohmann::json event = {{"phase", "test"}, {"epoch", epoch}, {"iteration", iteration},
                          {"loss", num_samples > 0 ? loss_sum / num_samples : 0.0},
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
  metrics->write(event);
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
