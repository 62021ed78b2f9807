#include <largo/checkpoint/training_state.h>

#include <largo/checkpoint/model_state.h>
#include <largo/checkpoint/run_directory.h>
#include <largo/checkpoint/sharded_checkpoint.h>
#include <largo/core/error.h>
#include <largo/core/rng_state.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <set>
#include <unordered_map>

namespace largo::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr const char* kLargoVersion = "0.1.0";

c10::IValue optional_value(const std::optional<double>& value) {
  return value ? c10::IValue(*value) : c10::IValue();
}

StateDict model_dict(std::vector<std::pair<std::string, at::Tensor>> model_state) {
  StateDict model(c10::StringType::get(), c10::TensorType::get());
  for (auto& [name, tensor] : model_state) {
    model.insert(name, tensor);
  }
  return model;
}

// The "averages" of a ModelEma::state_dict() entry, by name. Throws CheckpointError for
// another layout.
std::unordered_map<std::string, at::Tensor> whole_averages(const c10::IValue& entry) {
  if (!entry.isGenericDict() || !entry.toGenericDict().contains("averages") ||
      !entry.toGenericDict().at("averages").isGenericDict()) {
    throw CheckpointError("expected a dict with an \"averages\" dict (ModelEma::state_dict())");
  }
  std::unordered_map<std::string, at::Tensor> averages;
  for (const auto& item : entry.toGenericDict().at("averages").toGenericDict()) {
    if (!item.value().isTensor()) {
      throw CheckpointError(fmt::format("averages[{}] is not a tensor", item.key().toStringRef()));
    }
    averages.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  return averages;
}

constexpr const char* kStatefulSampler = "StatefulDistributedSampler";
constexpr const char* kWebDatasetSampler = "WebDatasetSampler";

// How the run that wrote a checkpoint read its training data: its "train_sampler" entry, with
// what the checkpoints of earlier versions lack derived from the rest (dataset_size -1:
// unknown).
struct SavedReading {
  std::string type;
  int64_t num_replicas = 1; // a pipeline's stages share theirs
  int64_t batch_size = 1;
  int64_t micro_steps = 1;
  int64_t dataset_size = -1;
  int64_t samples_per_replica = 0; // read by each replica in its stretch of the epoch
  std::vector<ReadStretch> earlier_stretches;
  int64_t stretch_start_iteration = 0;
  std::string order;
};

int64_t int_entry(const c10::impl::GenericDict& entries, const char* key, int64_t fallback) {
  return entries.contains(key) ? entries.at(key).toInt() : fallback;
}

SavedReading
saved_reading(const StateDict& state, int64_t saved_world_size, int64_t iteration_in_epoch) {
  SavedReading saved;
  saved.num_replicas = saved_world_size;
  auto sampler = state.find("train_sampler");
  if (sampler == state.end() || !sampler->value().isGenericDict()) {
    return saved;
  }
  const auto entries = sampler->value().toGenericDict();
  saved.type = entries.contains("type") ? entries.at("type").toStringRef() : "";
  saved.order = entries.contains("order") ? entries.at("order").toStringRef() : "";
  saved.num_replicas = int_entry(entries, "num_replicas", saved_world_size);
  saved.batch_size = int_entry(entries, "batch_size", 1);
  saved.stretch_start_iteration = int_entry(entries, "stretch_start_iteration", 0);
  const int64_t start_iter = int_entry(entries, "start_iter", 0); // micro-batches
  const int64_t steps = iteration_in_epoch - saved.stretch_start_iteration;
  saved.micro_steps =
      int_entry(entries, "micro_steps_per_iteration", steps > 0 ? start_iter / steps : 1);
  saved.dataset_size = int_entry(entries, "dataset_size", -1);
  saved.samples_per_replica =
      int_entry(entries, "samples_per_replica", start_iter * saved.batch_size);
  if (entries.contains("earlier_stretches")) {
    const auto flat = entries.at("earlier_stretches").toListRef(); // [replicas, samples, ...]
    for (size_t i = 0; i + 1 < flat.size(); i += 2) {
      saved.earlier_stretches.push_back(ReadStretch{flat[i].toInt(), flat[i + 1].toInt()});
    }
  }
  return saved;
}

// This rank's part of a whole model's state (the entries its module holds: a pipeline stage's
// own), after checking that the state has no entry the whole model lacks. Where the module
// is the whole model the state is returned as it is, and check_model_state_dict names what
// is missing or unexpected.
StateDict own_entries(
    const parallel::ParallelModel& model, const StateDict& state, const std::string& where) {
  const auto names = model.whole_model_names();
  const std::set<std::string> model_names(names.begin(), names.end());
  const auto own_names = model.module()->named_parameters().keys();
  std::set<std::string> own(own_names.begin(), own_names.end());
  for (const auto& buffer : model.module()->named_buffers()) {
    own.insert(buffer.key());
  }
  if (own == model_names) {
    return state;
  }
  StateDict part(c10::StringType::get(), c10::AnyType::get());
  std::vector<std::string> unexpected;
  for (const auto& item : state) {
    const std::string name = item.key().isString() ? item.key().toStringRef() : "?";
    if (model_names.count(name) == 0) {
      unexpected.push_back(name);
    } else if (own.count(name) > 0) {
      part.insert(item.key(), item.value());
    }
  }
  if (!unexpected.empty()) {
    throw CheckpointError(fmt::format(
        "{}: the model has no entries named {}; the checkpoint is of another model",
        where,
        fmt::join(unexpected, ", ")));
  }
  return part;
}

std::optional<double> optional_double(const StateDict& state, const char* key) {
  auto it = state.find(key);
  if (it == state.end() || it->value().isNone()) {
    return std::nullopt;
  }
  return it->value().toDouble();
}

} // namespace

TrainingState::TrainingState(
    parallel::ParallelModel& model,
    SamplerDescription sampler,
    std::string config_yaml,
    uint64_t seed)
    : model_(model),
      sampler_(std::move(sampler)),
      config_yaml_(std::move(config_yaml)),
      seed_(seed) {}

void TrainingState::save(const fs::path& dir, const std::string& file_name) {
  comm::ProcessGroup& group = model_.process_group();
  // Every rank contributes its RNG state, so a resumed run continues each rank's dropout
  // stream (rank 0 alone writes the file).
  at::Tensor own_rng = cpu_rng_state();
  at::Tensor rng_states = at::empty({group.world_size(), own_rng.numel()}, own_rng.options());
  group.all_gather(rng_states, own_rng);
  // Optimizer state in flat pieces (placements): each rank writes its own, the main file
  // refers to them.
  c10::IValue optimizer_entry;
  if (auto shard = model_.optimizer_shard()) {
    optimizer_entry = save_optimizer_shards(
        dir,
        file_name,
        parallel::piece_state_dict(*shard->optimizer, shard->ownership, shard->type),
        group);
  } else {
    optimizer_entry = model_.optimizer_state_dict(); // whole: stages and slices gathered
  }
  auto model_state = model_.model_state_dict(/*root=*/0); // FSDP: gathered unit by unit
  const c10::IValue ema_entry = model_ema_entry();
  StateDict loss_state = make_state_dict();
  insert_loss_state(loss_state); // collective: every rank's state gathered
  if (group.rank() != 0) {
    return;
  }
  StateDict state = state_dict(optimizer_entry, rng_states, std::move(model_state), ema_entry);
  for (const auto& item : loss_state) {
    state.insert(item.key(), item.value());
  }
  save_checkpoint(dir / file_name, state);
  point_latest_checkpoint_at(dir, file_name);
  spdlog::info("checkpoint written: {}", (dir / file_name).string());
}

void TrainingState::save_model(const fs::path& dir, const std::string& file_name) {
  auto model_state = model_.model_state_dict(/*root=*/0); // FSDP: gathered unit by unit
  if (model_.process_group().rank() != 0) {
    return;
  }
  StateDict state = make_state_dict();
  state.insert("model", model_dict(std::move(model_state)));
  insert_progress(state);
  state.insert("largo_version", std::string(kLargoVersion));
  state.insert("config", config_yaml_);
  save_checkpoint(dir / file_name, state);
  spdlog::info(
      "model written: {} (after epoch {}, test top-1 {:.2f} %)",
      (dir / file_name).string(),
      progress.epoch,
      progress.top1.value_or(0.0));
}

// Where the run stands and its last evaluation, as every file of the run records it.
void TrainingState::insert_progress(StateDict& state) const {
  state.insert("epoch", progress.epoch);
  state.insert("iteration_in_epoch", progress.iteration_in_epoch);
  state.insert("iteration", progress.iteration);
  state.insert("iterations_per_epoch", progress.iterations_per_epoch);
  state.insert("num_epochs", progress.num_epochs);
  state.insert("complete", progress.complete);
  state.insert("top1", optional_value(progress.top1));
  state.insert("top5", optional_value(progress.top5));
  state.insert("best_top1", optional_value(progress.best_top1));
}

StateDict TrainingState::state_dict(
    const c10::IValue& optimizer_entry,
    const at::Tensor& rng_states,
    std::vector<std::pair<std::string, at::Tensor>> model_state,
    const c10::IValue& ema_entry) const {
  comm::ProcessGroup& group = model_.process_group();
  StateDict state = make_state_dict();
  state.insert("model", model_dict(std::move(model_state)));
  state.insert("optimizer", optimizer_entry);
  state.insert("precision", model_.precision().state_dict()); // loss scale, O2 masters
  insert_progress(state);
  state.insert("rng_state", rng_states[group.rank()].clone());
  state.insert("rng_states", rng_states);
  state.insert("world_size", static_cast<int64_t>(group.world_size()));
  // Where the training sampler stands, in VISSL's terms.
  StateDict sampler = make_state_dict();
  sampler.insert("type", sampler_.type);
  sampler.insert("epoch", progress.epoch);
  // start_iter counts the micro-batches of this run's stretch of the epoch (all of it, unless
  // the epoch was continued at another world size).
  const int64_t micro_steps = (progress.iteration_in_epoch - progress.stretch_start_iteration) *
                              sampler_.micro_steps_per_iteration;
  sampler.insert("start_iter", micro_steps);
  sampler.insert("batch_size", sampler_.batch_size);
  sampler.insert("num_replicas", static_cast<int64_t>(model_.data_parallel_group().world_size()));
  // What continuing the epoch at another world size needs.
  sampler.insert("micro_steps_per_iteration", sampler_.micro_steps_per_iteration);
  sampler.insert("dataset_size", sampler_.dataset_size);
  sampler.insert("samples_per_replica", micro_steps * sampler_.batch_size);
  sampler.insert("stretch_start_iteration", progress.stretch_start_iteration);
  sampler.insert("order", sampler_.order);
  c10::List<int64_t> earlier;
  for (const ReadStretch& stretch : progress.earlier_stretches) {
    earlier.push_back(stretch.num_replicas);
    earlier.push_back(stretch.samples_per_replica);
  }
  sampler.insert("earlier_stretches", earlier);
  state.insert("train_sampler", sampler);
  if (!ema_entry.isNone()) {
    state.insert("ema_model", ema_entry);
  }
  state.insert("largo_version", std::string(kLargoVersion));
  state.insert("config", config_yaml_);
  return state;
}

void TrainingState::load_progress(const StateDict& state, const std::string& where) {
  auto entry = [&](const char* key) -> const c10::IValue& { return state_at(state, key, where); };
  progress.epoch = entry("epoch").toInt();
  progress.iteration_in_epoch = entry("iteration_in_epoch").toInt();
  progress.iteration = entry("iteration").toInt();
  progress.complete = entry("complete").toBool();
  progress.earlier_stretches.clear(); // load_epoch_position restores them
  progress.stretch_start_iteration = 0;
  progress.top1 = optional_double(state, "top1");
  progress.top5 = optional_double(state, "top5");
  progress.best_top1 = optional_double(state, "best_top1");
}

void TrainingState::load_for_evaluation(const fs::path& path) {
  const StateDict state = load_checkpoint(path, {"model", "epoch", "iteration"});
  const std::string where = path.string();
  load_progress(state, where);
  load_model(state, where);
  load_model_ema(state, where);
}

bool TrainingState::load(const fs::path& path, bool unless_final) {
  const StateDict state = load_checkpoint(path, {"model", "optimizer", "epoch", "iteration"});
  const std::string where = path.string();
  auto entry = [&](const char* key) -> const c10::IValue& { return state_at(state, key, where); };
  if (unless_final && entry("complete").toBool()) {
    return false;
  }
  const int64_t iterations_per_epoch = progress.iterations_per_epoch;
  load_progress(state, where);
  const int64_t saved_world_size = state.contains("world_size") ? entry("world_size").toInt() : 1;
  load_epoch_position(state, where, iterations_per_epoch);
  load_model(state, where);
  auto precision_state = state.find("precision"); // absent in checkpoints of Largo 0.1.0
  model_.precision().load_state_dict(
      precision_state == state.end() ? c10::IValue() : precision_state->value());
  load_optimizer(state, fs::canonical(path).parent_path(), where);
  load_rng(state, saved_world_size);
  load_model_ema(state, where);
  load_loss_state(state, saved_world_size, where);
  return true;
}

namespace {

// Whether a run reads its epochs as the saved one did (then the saved position is its own).
bool reads_alike(const SavedReading& saved, const SamplerDescription& current, int64_t replicas) {
  return saved.type == current.type && saved.order == current.order &&
         saved.num_replicas == replicas && saved.batch_size == current.batch_size &&
         saved.micro_steps == current.micro_steps_per_iteration &&
         (saved.dataset_size < 0 || saved.dataset_size == current.dataset_size);
}

// Throws CheckpointError, naming the key to change, unless the samples an interrupted epoch
// has not read can be told and split over this run's replicas.
void check_epoch_can_continue(
    const SavedReading& saved,
    int64_t saved_world_size,
    const SamplerDescription& current,
    bool one_rank_per_replica,
    const std::string& layout) {
  const std::string instead =
      "; resume with the original settings, or from an end-of-epoch checkpoint "
      "(model_phase*.torch)";
  if (saved_world_size != saved.num_replicas || !one_rank_per_replica) {
    throw CheckpointError(fmt::format(
        "{}, so the rest of that epoch cannot be served exactly: an epoch continues in another "
        "layout only with one rank per data replica (DDP, ZeRO, FSDP), not with "
        "DISTRIBUTED.PIPELINE_SIZE or DISTRIBUTED.TENSOR_PARALLEL_SIZE above 1 in either run, "
        "whose ranks' random streams would not carry over{}",
        layout,
        instead));
  }
  if (saved.type == kWebDatasetSampler || current.type == kWebDatasetSampler) {
    throw CheckpointError(fmt::format(
        "{} (the saved order: {} {}; this run's: {} {}), so the rest of that epoch cannot be "
        "served exactly: a webdataset epoch streams its shards per rank and loader thread, and "
        "continues only with the world size, DATA.TRAIN.BATCHSIZE_PER_REPLICA, "
        "DATA.NUM_DATALOADER_WORKERS and DATA.TRAIN.WEBDATASET.SHUFFLE_BUFFER it began with{}",
        layout,
        saved.type.empty() ? "an unrecorded sampler" : saved.type,
        saved.order,
        current.type,
        current.order,
        instead));
  }
  if (saved.type != kStatefulSampler || current.type != kStatefulSampler) {
    throw CheckpointError(fmt::format(
        "{}, so the rest of that epoch cannot be served exactly: continuing it in another layout "
        "needs DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER=True in both runs (the saved run used "
        "{}, this one {}){}",
        layout,
        saved.type.empty() ? "an unrecorded sampler" : saved.type,
        current.type,
        instead));
  }
  if (saved.dataset_size != current.dataset_size) {
    throw CheckpointError(fmt::format(
        "{}, so the rest of that epoch cannot be served exactly: the saved run partitioned {} "
        "training samples and this one {} (DATA.TRAIN.DATA_SOURCES / DATA_LIMIT changed){}",
        layout,
        saved.dataset_size < 0 ? std::string("an unrecorded number of")
                               : std::to_string(saved.dataset_size),
        current.dataset_size,
        instead));
  }
}

} // namespace

// Mid-epoch, the rest of the epoch is read as the saved run would have read it when this run
// reads alike; otherwise it is continued with the samples not yet read (a new stretch), when
// that can be done exactly.
void TrainingState::load_epoch_position(
    const StateDict& state, const std::string& where, int64_t iterations_per_epoch) {
  if (progress.iteration_in_epoch == 0) {
    return; // at an epoch's start every run reads the epoch afresh
  }
  const int64_t saved_world_size =
      state.contains("world_size") ? state.at("world_size").toInt() : 1;
  const SavedReading saved = saved_reading(state, saved_world_size, progress.iteration_in_epoch);
  const int64_t saved_iterations = state_at(state, "iterations_per_epoch", where).toInt();
  const int world_size = model_.process_group().world_size();
  const int replicas = model_.data_parallel_group().world_size();
  if (reads_alike(saved, sampler_, replicas) && saved_world_size == world_size &&
      (!saved.earlier_stretches.empty() || saved_iterations == iterations_per_epoch)) {
    progress.earlier_stretches = saved.earlier_stretches;
    progress.stretch_start_iteration = saved.stretch_start_iteration;
    return;
  }
  const std::string layout = fmt::format(
      "{} was written mid-epoch by {} rank(s) ({} reading data, batch {} x {} micro-step(s)) "
      "with {} iterations per epoch, but this run has {} rank(s) ({} reading data, batch {} x {}) "
      "and {} iterations per epoch",
      where,
      saved_world_size,
      saved.num_replicas,
      saved.batch_size,
      saved.micro_steps,
      saved_iterations,
      world_size,
      replicas,
      sampler_.batch_size,
      sampler_.micro_steps_per_iteration,
      iterations_per_epoch);
  check_epoch_can_continue(saved, saved_world_size, sampler_, world_size == replicas, layout);
  progress.earlier_stretches = saved.earlier_stretches;
  progress.earlier_stretches.push_back(ReadStretch{saved.num_replicas, saved.samples_per_replica});
  progress.stretch_start_iteration = progress.iteration_in_epoch;
  if (model_.process_group().rank() == 0) {
    spdlog::info(
        "{} was written mid-epoch {} by {} data replica(s); this run's {} continue it with the "
        "samples not yet read",
        where,
        progress.epoch + 1,
        saved.num_replicas,
        replicas);
  }
}

void TrainingState::load_model(const StateDict& state, const std::string& where) {
  const StateDict model_state =
      own_entries(model_, state_at(state, "model", where).toGenericDict(), where);
  // Copies gathered from flat shards (FSDP's compute copies) may differ in dtype from the
  // float32 values saved. Split values (tensor parallelism's) are checked against their
  // whole shapes (a replicated parameter's whole shape is its own).
  check_model_state_dict(
      *model_.module(),
      model_state,
      /*exact_floating_dtypes=*/!model_.placements().module_holds_gathered_copies(),
      where,
      model_.trained_parameter_shapes());
  std::unordered_map<std::string, at::Tensor> values;
  for (const auto& item : model_state) {
    values.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  model_.load_model_state_dict(values);
}

void TrainingState::load_optimizer(
    const StateDict& state, const fs::path& checkpoint_dir, const std::string& where) {
  const c10::IValue& entry = state_at(state, "optimizer", where);
  // A pipeline rank's optimizer steps its stages' parameters only: ZeRO's pieces of the
  // whole model cannot be laid onto it.
  const parallel::StatePlacements placements = model_.placements();
  if (!placements.cover_whole_model() && !placements.optimizer_state_in_flat_pieces() &&
      is_sharded_optimizer_entry(entry)) {
    throw CheckpointError(fmt::format(
        "{} holds ZeRO optimizer shards, which a pipeline cannot split by stage; consolidate "
        "it first (largo checkpoint consolidate {}) and resume from the consolidated file",
        where,
        where));
  }
  const auto shapes = model_.trained_parameter_shapes();
  try {
    if (auto shard = model_.optimizer_shard()) {
      load_piece_optimizer_state(
          checkpoint_dir, entry, *shard->optimizer, shard->ownership, shapes);
    } else { // the model maps the whole state onto what it steps (a stage's part, its slices)
      model_.load_optimizer_state_dict(whole_optimizer_state(checkpoint_dir, entry, shapes));
    }
  } catch (const CheckpointError& e) { // the optimizer's words, with the file they are about
    throw CheckpointError(fmt::format("{}: its optimizer state: {}", where, e.what()));
  }
}

// Each rank continues its own random stream; with another world size there is none to
// continue, so ranks re-seed from the seed, their data replica and the iteration.
void TrainingState::load_rng(const StateDict& state, int64_t saved_world_size) {
  comm::ProcessGroup& group = model_.process_group();
  if (state.contains("rng_states") && saved_world_size == group.world_size()) {
    set_cpu_rng_state(state.at("rng_states").toTensor()[group.rank()].contiguous());
  } else if (group.world_size() == 1 && state.contains("rng_state")) {
    set_cpu_rng_state(state.at("rng_state").toTensor());
  } else {
    // By data replica: its tensor-parallel shards and pipeline stages draw alike (the
    // trainer seeds so too), which for DDP, ZeRO and FSDP is the rank.
    seed_everything(
        seed_ + static_cast<uint64_t>(model_.data_parallel_group().rank()) +
        static_cast<uint64_t>(progress.iteration) * 1000003u);
  }
}

void TrainingState::attach_model_ema(
    optim::ModelEma& ema, optim::NamedTensors model_tensors, bool save_average) {
  ema_ = &ema;
  ema_tensors_ = std::move(model_tensors);
  save_ema_ = save_average;
}

void TrainingState::attach_loss_state(
    LossStateGetter get, LossStateSetter set, LossStateScope scope) {
  get_loss_state_ = std::move(get);
  set_loss_state_ = std::move(set);
  loss_state_scope_ = scope;
}

// Collective: each entry gathered from every rank into [world, ...].
void TrainingState::insert_loss_state(StateDict& state) {
  if (!get_loss_state_) {
    return;
  }
  const auto own = get_loss_state_();
  if (own.empty()) {
    return;
  }
  comm::ProcessGroup& group = model_.process_group();
  StateDict first(c10::StringType::get(), c10::TensorType::get());
  StateDict every(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, tensor] : own) {
    const at::Tensor local = tensor.detach().cpu().contiguous();
    std::vector<int64_t> shape{group.world_size()};
    shape.insert(shape.end(), local.sizes().begin(), local.sizes().end());
    at::Tensor gathered = at::empty(shape, local.options());
    group.all_gather(gathered, local);
    first.insert(name, gathered[0].clone());
    every.insert(name, gathered);
  }
  state.insert("loss", first);
  state.insert("loss_states", every);
}

// Each rank's own at the saved world size. At another, a state that is the same on every rank
// is rank 0's; a per-rank one does not carry over (SwAV's queue and DeepCluster v2's memory are
// sized by the world), so the loss keeps its fresh state.
void TrainingState::load_loss_state(
    const StateDict& state, int64_t saved_world_size, const std::string& where) {
  if (!set_loss_state_ || get_loss_state_().empty()) {
    return;
  }
  comm::ProcessGroup& group = model_.process_group();
  const bool saved = state.contains("loss_states") && state.at("loss_states").isGenericDict();
  const bool same_world = saved_world_size == group.world_size();
  if (!saved || (!same_world && loss_state_scope_ == LossStateScope::kPerRank)) {
    if (group.rank() == 0) {
      spdlog::warn(
          "{} holds no loss state for {} rank(s) (the loss's state: SwAV's or MoCo's queue, "
          "DINO's teacher and center, DeepCluster v2's memory): it starts afresh (a queue fills "
          "again within queue_length / global batch iterations, DeepCluster v2's memory by a "
          "pass over the data)",
          where,
          group.world_size());
    }
    return;
  }
  const int64_t entry = same_world ? group.rank() : 0;
  if (!same_world && group.rank() == 0) {
    spdlog::info(
        "{}: the loss's state, the same on every rank, carries over from {} to {} rank(s) "
        "(rank 0's)",
        where,
        saved_world_size,
        group.world_size());
  }
  std::map<std::string, at::Tensor> values;
  for (const auto& item : state.at("loss_states").toGenericDict()) {
    values.emplace(item.key().toStringRef(), item.value().toTensor()[entry].clone());
  }
  try {
    set_loss_state_(values);
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format("{}: its loss state: {}", where, e.what()));
  }
}

// Collective under FSDP: each rank's average of its pieces is put into the model, gathered
// as the model is, and the model's own values put back.
c10::IValue TrainingState::model_ema_entry() {
  if (ema_ == nullptr || !save_ema_) {
    return {};
  }
  c10::IValue entry = ema_->state_dict();
  if (!model_.placements().module_holds_whole_model()) {
    std::vector<std::pair<std::string, at::Tensor>> whole;
    {
      const optim::AverageInModel average(*ema_, ema_tensors_);
      whole = model_.model_state_dict(/*root=*/0);
    }
    c10::impl::GenericDict averages(c10::StringType::get(), c10::AnyType::get());
    for (auto& [name, value] : whole) {
      averages.insert(name, std::move(value));
    }
    entry.toGenericDict().insert_or_assign("averages", averages);
  }
  return entry;
}

void TrainingState::load_model_ema(const StateDict& state, const std::string& where) {
  if (!ema_) {
    return;
  }
  auto entry = state.find("ema_model");
  if (entry == state.end()) {
    ema_->set(ema_tensors_);
    spdlog::info(
        "{} holds no model EMA (HOOKS.EMA_MODEL.SAVE_EMA_MODEL was False): the average "
        "starts again from its weights",
        where);
    return;
  }
  try {
    // Whole tensors in a sharded model: each rank keeps its pieces, via the model.
    if (!model_.placements().module_holds_whole_model()) {
      const optim::AverageInModel keep_own(*ema_, ema_tensors_);
      model_.load_model_state_dict(whole_averages(entry->value()));
      ema_->set(ema_tensors_);
    } else {
      ema_->load_state_dict(entry->value());
    }
  } catch (const Error& e) {
    throw CheckpointError(fmt::format("{}: its ema_model: {}", where, e.what()));
  }
}

} // namespace largo::checkpoint
