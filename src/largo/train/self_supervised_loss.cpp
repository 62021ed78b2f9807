#include <largo/train/self_supervised_loss.h>

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/models/dino_head.h>
#include <largo/models/dino_teacher_momentum.h>

#include <ATen/CPUGeneratorImpl.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::train {
namespace {

models::SwavHeadImpl* find_swav_head(torch::nn::Module& module) {
  for (const auto& item : module.named_modules()) {
    if (auto* head = item.value()->as<models::SwavHeadImpl>()) {
      return head;
    }
  }
  throw ConfigError(
      "LOSS.name = swav_loss needs a swav_head: set MODEL.HEAD.PARAMS to "
      "[[\"swav_head\", {\"dims\": [trunk width, ..., embedding], \"num_clusters\": [K]}]]");
}

} // namespace

int64_t local_queue_length(int64_t queue_length, int64_t batch_size, int64_t world_size) {
  const int64_t global_batch = batch_size * world_size;
  return (queue_length - queue_length % global_batch) / world_size;
}

SelfSupervisedLoss::SelfSupervisedLoss(
    SelfSupervisedLossOptions options,
    int64_t num_views,
    torch::nn::Module& module,
    comm::ProcessGroup& group,
    int64_t batch_size,
    uint64_t seed)
    : options_(std::move(options)), group_(group), seed_(seed) {
  options_.swav.num_crops = num_views;
  const auto parameters = module.named_parameters();
  for (const auto& [name, iteration] : options_.frozen_parameters) {
    const at::Tensor* parameter = parameters.find(name);
    if (parameter == nullptr) {
      throw config_error(
          "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP",
          name,
          fmt::format(
              "a parameter of the model, e.g. {} (VISSL's module.heads.<i>. is Largo's head.<i>.)",
              parameters.is_empty() ? std::string("none") : parameters.keys().back()));
    }
    frozen_.emplace_back(name, iteration);
  }
  if (options_.is_moco()) {
    build_moco(module, batch_size, seed);
    return;
  }
  if (options_.is_dino()) {
    build_dino(module, num_views);
    return;
  }
  if (options_.is_deepclusterv2()) {
    options_.deepclusterv2_memory.num_crops = num_views;
    const auto parameters_list = module.parameters();
    memory_.emplace(
        options_.deepclusterv2_memory,
        parameters_list.empty() ? c10::Device(c10::kCPU) : parameters_list.front().device());
    return;
  }
  if (!options_.is_swav()) {
    return;
  }
  head_ = find_swav_head(module);
  for (const auto& prototypes : head_->prototypes()) {
    for (const auto& item : parameters) {
      if (item.value().is_same(prototypes->weight)) {
        prototype_names_.push_back(item.key());
      }
    }
  }
  const int64_t length = local_queue_length(options_.queue_length, batch_size, group.world_size());
  if (length > 0) {
    queue_length_ = length;
    models::SwavQueueOptions queue;
    queue.length = length;
    queue.start_iter = options_.queue_start_iter;
    queue.embedding_dim = head_->options().dims.back();
    queue.num_prototypes = head_->options().num_clusters;
    queue.num_crops = num_views;
    queue.crops_for_assign = options_.swav.crops_for_assign;
    queue_.emplace(
        queue,
        at::make_generator<at::CPUGeneratorImpl>(seed),
        head_->prototypes().front()->weight.device());
  }
}

// VISSL's MoCoLoss: its queue drawn from `seed` (the trainer passes SEED_VALUE on every rank,
// so that every rank holds the same queue), then only ever written with every rank's keys.
void SelfSupervisedLoss::build_moco(torch::nn::Module& module, int64_t batch_size, uint64_t seed) {
  moco_model_ = module.as<models::MocoModelImpl>();
  if (moco_model_ == nullptr) {
    throw ConfigError(
        "LOSS.name = moco_loss trains a MocoModel (query and momentum encoders): build the run's "
        "model with ModelOptions::moco enabled");
  }
  const int64_t keys_per_call = batch_size * group_.world_size();
  if (options_.moco_queue_size <= 0 || options_.moco_queue_size % keys_per_call != 0) {
    throw config_error(
        "LOSS.moco_loss.queue_size",
        std::to_string(options_.moco_queue_size),
        fmt::format(
            "a multiple of the keys each loss call writes ({} = {} per rank x {} rank(s)), as "
            "VISSL asserts: they are written into the queue in one piece",
            keys_per_call,
            batch_size,
            group_.world_size()));
  }
  const auto parameters = module.parameters();
  moco_queue_.emplace(
      models::MocoQueueOptions{options_.moco_embedding_dim, options_.moco_queue_size},
      at::make_generator<at::CPUGeneratorImpl>(seed),
      parameters.empty() ? c10::Device(c10::kCPU) : parameters.front().device());
}

void SelfSupervisedLoss::build_dino(torch::nn::Module& module, int64_t num_views) {
  dino_model_ = module.as<models::DinoModelImpl>();
  if (dino_model_ == nullptr) {
    throw ConfigError(
        "LOSS.name = dino_loss trains a DinoModel (student and teacher): build the run's model "
        "with ModelOptions::dino enabled and a dino_head");
  }
  const auto heads = module.modules();
  for (const auto& child : heads) {
    if (const auto* head = child->as<models::DinoHeadImpl>()) {
      options_.dino.output_dim = head->options().num_clusters;
    }
  }
  options_.dino.num_crops = num_views;
  dino_loss_.emplace(options_.dino);
}

at::Tensor SelfSupervisedLoss::loss(const at::Tensor& output, const at::Tensor& labels) {
  if (memory_) {
    return deepclusterv2(output, labels);
  }
  if (options_.is_moco()) {
    return moco(output);
  }
  if (options_.is_dino()) {
    return dino(output);
  }
  if (options_.is_barlow_twins()) {
    return models::barlow_twins_loss(output, group_, options_.barlow_twins);
  }
  if (!options_.is_swav()) {
    // VISSL's SimclrInfoNCELoss L2-normalises the head's output (F.normalize, eps 1e-12)
    // before its criterion.
    const at::Tensor normalized = output / output.norm(2, 1, /*keepdim=*/true).clamp_min(1e-12);
    return models::simclr_info_nce_loss(normalized, group_, options_.simclr);
  }
  return swav(output);
}

// `output`: [crops * n, embedding | scores of set 0 | scores of set 1 | ...] (MultiCropModel
// concatenates the swav_head's list).
at::Tensor SelfSupervisedLoss::swav(const at::Tensor& output) {
  const models::SwavHeadOptions& head = head_->options();
  const int64_t embedding_dim = head.dims.back();
  if (queue_ && queue_->in_use(calls_ - 1)) {
    queue_->rescore(*head_); // VISSL's SwAVUpdateQueueScoresHook, after the forward
  }
  const bool use_queue = queue_ && queue_->in_use(calls_);
  const bool hard = calls_ < options_.temp_hard_assignment_iters;
  at::Tensor loss = at::zeros({}, output.options());
  int64_t offset = embedding_dim;
  for (size_t j = 0; j < head.num_clusters.size(); ++j) {
    const at::Tensor scores = output.narrow(1, offset, head.num_clusters[j]);
    offset += head.num_clusters[j];
    loss = loss + models::swav_loss(
                      scores,
                      group_,
                      options_.swav,
                      use_queue ? queue_->scores(j) : std::vector<at::Tensor>{},
                      hard);
  }
  loss = loss / static_cast<double>(head.num_clusters.size());
  ++calls_;
  if (use_queue) {
    queue_->push(output.narrow(1, 0, embedding_dim).detach());
  }
  return loss;
}

// `output`: [n, query | key] (MocoModel::forward), each options_.moco_embedding_dim wide.
at::Tensor SelfSupervisedLoss::moco(const at::Tensor& output) {
  const int64_t d = options_.moco_embedding_dim;
  if (output.dim() != 2 || output.size(1) != 2 * d) {
    throw config_error(
        "LOSS.moco_loss.embedding_dim",
        std::to_string(d),
        fmt::format(
            "the head's output width ({}): set MODEL.HEAD.PARAMS' last dims to it",
            output.dim() == 2 ? output.size(1) / 2 : int64_t{0}));
  }
  const at::Tensor key = output.narrow(1, d, d);
  const at::Tensor loss =
      models::moco_loss(output.narrow(1, 0, d), key, moco_queue_->keys(), options_.moco);
  moco_queue_->enqueue(key, group_); // after the loss, as VISSL's forward does
  ++calls_;
  return loss;
}

// `output`: [(num_crops + T) * n, K] (DinoModel::forward): the student's rows, then the
// teacher's.
at::Tensor SelfSupervisedLoss::dino(const at::Tensor& output) {
  const int64_t crops = options_.dino.num_crops;
  const auto teacher_crops = static_cast<int64_t>(options_.dino.crops_for_teacher.size());
  const int64_t n = output.size(0) / (crops + teacher_crops);
  ++calls_;
  return dino_loss_->forward(
      output.narrow(0, 0, crops * n),
      output.narrow(0, crops * n, teacher_crops * n),
      iteration_,
      group_);
}

// `output`: [crops * n, d], crop-major (MultiCropModel); `labels` [n]: the images' indexes
// (DATA.TRAIN.LABEL_TYPE sample_index), VISSL's idx.
at::Tensor SelfSupervisedLoss::deepclusterv2(const at::Tensor& output, const at::Tensor& labels) {
  const int64_t d = options_.deepclusterv2_memory.embedding_dim;
  if (output.dim() != 2 || output.size(1) != d) {
    throw config_error(
        "LOSS.deepclusterv2_loss.memory_params.embedding_dim",
        std::to_string(d),
        fmt::format(
            "the head's output width ({}): set MODEL.HEAD.PARAMS' last dims to it",
            output.dim() == 2 ? output.size(1) : int64_t{0}));
  }
  const at::Tensor loss = models::deepclusterv2_loss(
      output, memory_->centroids(), memory_->targets(labels), options_.deepclusterv2);
  memory_->write(output, labels); // after the loss, as VISSL's forward does
  ++calls_;
  return loss;
}

void SelfSupervisedLoss::fill_memory(const at::Tensor& output, const at::Tensor& labels) {
  TORCH_INTERNAL_ASSERT(memory_, "fill_memory: not a DeepCluster v2 loss");
  memory_->write(output, labels);
}

void SelfSupervisedLoss::start_epoch(int64_t epoch) {
  if (!memory_ || clustered_epoch_ == epoch) {
    return;
  }
  TORCH_INTERNAL_ASSERT(memory_filled_, "start_epoch: the memory's initial pass has not run");
  memory_->cluster(
      group_, at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch)));
  clustered_epoch_ = epoch;
}

void SelfSupervisedLoss::before_optimizer_step(parallel::ParallelModel& model) {
  std::vector<std::string> frozen;
  for (const auto& [name, iteration] : frozen_) {
    if (iteration_ < iteration) {
      frozen.push_back(name);
    }
  }
  if (!frozen.empty()) {
    model.drop_gradients(frozen); // the optimizer skips them: no decay, no momentum
  }
}

bool SelfSupervisedLoss::module_holds_whole_model(const parallel::ParallelModel& model) {
  if (!module_holds_whole_model_.has_value()) { // placements are fixed for the run
    module_holds_whole_model_ = model.placements().module_holds_whole_model();
  }
  return *module_holds_whole_model_;
}

// The teacher and the momentum encoder stay whole on every rank (VISSL shards them with FSDP
// too): where the module's own tensors are shards, they read the gathered whole values. Every
// rank takes the same branch (placements() answer alike), so the gathers match.
void SelfSupervisedLoss::before_step(parallel::ParallelModel& model) {
  if ((dino_model_ == nullptr && moco_model_ == nullptr) || module_holds_whole_model(model)) {
    return; // the models read the module's own tensors, no copy
  }
  if (dino_model_ != nullptr && !dino_model_->teacher_built()) {
    const models::WholeParameters whole = model.full_parameters();
    dino_model_->build_teacher(&whole); // VISSL's: before the first forward reads it
  }
  if (moco_model_ != nullptr) { // this step's forwards advance it from these values
    moco_model_->set_whole_query_parameters(model.full_parameters());
  }
}

void SelfSupervisedLoss::after_optimizer_step(parallel::ParallelModel& model) {
  if (moco_model_ != nullptr) {
    moco_model_->set_whole_query_parameters({}); // the step's copy, no longer current
  }
  if (dino_model_ != nullptr) { // VISSL's DINOHook.on_update, with this step's iteration
    const double momentum = models::dino_teacher_momentum(
        options_.dino_momentum, iteration_, options_.dino_max_iteration);
    if (module_holds_whole_model(model)) {
      dino_model_->update_teacher(momentum);
    } else {
      const models::WholeParameters whole = model.full_parameters();
      dino_model_->update_teacher(momentum, &whole);
    }
    return;
  }
  if (head_ == nullptr || !options_.normalize_last_layer) {
    return;
  }
  // SwavHead::normalize_prototypes (VISSL's hook) on whole values, wherever they are kept.
  for (const std::string& name : prototype_names_) {
    model.update_full_parameter(name, models::SwavHeadImpl::normalize_prototype_rows);
  }
}

std::map<std::string, at::Tensor> SelfSupervisedLoss::state_dict() const {
  if (memory_) {
    std::map<std::string, at::Tensor> state = memory_->state_dict();
    state.emplace("memory_filled", at::tensor(int64_t{memory_filled_ ? 1 : 0}, at::kLong));
    state.emplace("clustered_epoch", at::tensor(clustered_epoch_, at::kLong));
    return state;
  }
  if (dino_loss_) {
    std::map<std::string, at::Tensor> state = dino_loss_->state_dict();
    state.merge(dino_model_->teacher_state_dict());
    return state;
  }
  if (moco_queue_) {
    std::map<std::string, at::Tensor> state = moco_queue_->state_dict();
    state.merge(moco_model_->momentum_state_dict());
    return state;
  }
  if (!queue_) {
    return {};
  }
  std::map<std::string, at::Tensor> state = queue_->state_dict();
  state.emplace("num_iteration", at::tensor(calls_, at::kLong));
  return state;
}

void SelfSupervisedLoss::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  if (memory_) {
    const auto filled = state.find("memory_filled");
    const auto clustered = state.find("clustered_epoch");
    if (filled == state.end() || clustered == state.end()) {
      throw CheckpointError(
          "the checkpoint's DeepCluster v2 state has no memory_filled or clustered_epoch; it "
          "was not written by a deepclusterv2_loss run");
    }
    memory_->load_state_dict(state);
    memory_filled_ = filled->second.item<int64_t>() != 0;
    clustered_epoch_ = clustered->second.item<int64_t>();
    return;
  }
  if (dino_loss_) {
    dino_loss_->load_state_dict(state);
    dino_model_->load_teacher_state_dict(state);
    return;
  }
  if (moco_queue_) {
    moco_queue_->load_state_dict(state);
    moco_model_->load_momentum_state_dict(state);
    return;
  }
  if (!queue_) {
    return;
  }
  auto calls = state.find("num_iteration");
  if (calls == state.end()) {
    throw CheckpointError(
        "the checkpoint's SwAV queue has no num_iteration; it was not written by a run with "
        "a queue (LOSS.swav_loss.queue.queue_length)");
  }
  queue_->load_state_dict(state);
  calls_ = calls->second.item<int64_t>();
}

std::string SelfSupervisedLoss::describe() const {
  if (memory_) {
    const models::DeepClusterV2MemoryOptions& memory = memory_->options();
    return fmt::format(
        "DeepCluster v2 ({} crops, temperature {}, k-means heads [{}] of {} iterations over {} "
        "rank(s), memory of crops [{}], {} images of width {} per rank, {} images in the "
        "dataset)",
        memory.num_crops,
        options_.deepclusterv2.temperature,
        fmt::join(memory.num_clusters, ", "),
        memory.kmeans_iters,
        group_.world_size(),
        fmt::join(memory.crops_for_mb, ", "),
        memory.memory_size_per_rank,
        memory.embedding_dim,
        memory.num_samples);
  }
  if (dino_loss_) {
    const models::DinoLossOptions& dino = options_.dino;
    return fmt::format(
        "DINO ({} crops, teacher on [{}], output {}, student temperature {}, teacher {} -> {} "
        "over {} iterations, center {} over {} rank(s), teacher momentum {} -> 1 over {} "
        "iterations)",
        dino.num_crops,
        fmt::join(dino.crops_for_teacher, ", "),
        dino.output_dim,
        dino.student_temp,
        dino.teacher_temp_min,
        dino.teacher_temp_max,
        dino.teacher_temp_warmup_iters,
        dino.center_momentum,
        group_.world_size(),
        options_.dino_momentum,
        options_.dino_max_iteration);
  }
  if (moco_model_ != nullptr) {
    const models::MocoModelOptions& model = moco_model_->options();
    return fmt::format(
        "MoCo (temperature {}, queue of {} keys of width {} filled from {} rank(s), momentum "
        "encoder at momentum {}, keys' batch {})",
        options_.moco.temperature,
        options_.moco_queue_size,
        options_.moco_embedding_dim,
        group_.world_size(),
        model.momentum,
        model.shuffle_batch && group_.world_size() > 1 ? "shuffled across the ranks"
                                                       : "not shuffled");
  }
  if (options_.is_barlow_twins()) {
    return fmt::format(
        "Barlow Twins (lambda {}, scale_loss {}, batch statistics and cross-correlation over "
        "{} rank(s))",
        options_.barlow_twins.lambda,
        options_.barlow_twins.scale_loss,
        group_.world_size());
  }
  if (!options_.is_swav()) {
    return fmt::format(
        "SimCLR InfoNCE (temperature {}, negatives from {} rank(s))",
        options_.simclr.temperature,
        group_.world_size());
  }
  const models::SwavHeadOptions& head = head_->options();
  return fmt::format(
      "SwAV ({} crops, assigned [{}], prototypes [{}] {}, Sinkhorn {} iterations in {}, queue {})",
      options_.swav.num_crops,
      fmt::join(options_.swav.crops_for_assign, ", "),
      fmt::join(head.num_clusters, ", "),
      options_.normalize_last_layer ? "normalised after each step" : "not normalised",
      options_.swav.num_iters,
      options_.swav.use_double_precision ? "float64" : "float32",
      queue_
          ? fmt::format(
                "of {} images per rank from loss call {}", queue_length_, options_.queue_start_iter)
          : std::string("off"));
}

} // namespace largo::train
