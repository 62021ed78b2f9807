#include <largo/train/run_plan.h>

#include "pipeline_plan.h"

#include <largo/comm/process_group.h>
#include <largo/comm/world_info.h>
#include <largo/core/error.h>
#include <largo/core/resources.h>
#include <largo/models/feature_taps.h>
#include <largo/models/model_factory.h>
#include <largo/precision/model_cast.h>
#include <largo/train/option_keys.h>
#include <largo/train/trainer_config.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

namespace largo::train {
namespace {

// The average's evaluation runs on the test split.
void check_model_ema_keys(const TrainerOptions& options) {
  if (!options.model_ema.enabled()) {
    return;
  }
  if (options.model_ema.meters && !options.test_model) {
    throw ConfigError(
        "HOOKS.EMA_MODEL.ENABLE_EMA_METERS evaluates the average on DATA.TEST beside the model, "
        "but TEST_MODEL is False: set TEST_MODEL True, or ENABLE_EMA_METERS False");
  }
}

// What the user sets in TrainerOptions::amp and check_nan, not in the parallel options.
void refuse_run_parts_in_parallel_options(const parallel::ParallelOptions& parallel) {
  if (parallel.precision.enabled) {
    throw OptionError(
        "TrainerOptions::parallel.precision",
        parallel.precision.describe(),
        "unset: the Trainer resolves it from TrainerOptions::amp (set that instead)");
  }
  if (!parallel.check_finite) {
    throw OptionError(
        "TrainerOptions::parallel.check_finite",
        "false",
        "true: the Trainer sets it from TrainerOptions::check_nan (set that instead)");
  }
}

// The options parallelize() is given: the user's, with the run's own parts set.
parallel::ParallelOptions parallel_options_of(const RunPlan& plan) {
  const TrainerOptions& options = plan.options;
  refuse_run_parts_in_parallel_options(options.parallel);
  parallel::ParallelOptions parallel = options.parallel;
  auto& checkpointing = parallel.activation_checkpointing;
  if (checkpointing.num_splits > 0 && checkpointing.probe_input_shape.empty()) {
    checkpointing.probe_input_shape = plan.model_data().sample_shape;
    if (!plan.model.view_shapes.empty()) { // a MultiCropModel takes its views packed
      checkpointing.probe_input_shape = {models::packed_size(plan.model.view_shapes)};
    }
    checkpointing.report_batch_size = options.train.batch_size;
  }
  parallel.precision = plan.precision;
  parallel.grad_scaler = options.grad_scaler;
  parallel.check_finite = options.check_nan;
  return parallel;
}

c10::Device device_of(const TrainerOptions& options) {
  return options.device == "gpu" && torch::cuda::is_available() ? c10::Device(c10::kCUDA)
                                                                : c10::Device(c10::kCPU);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("{}", fmt::join(shape, "x"));
}

// The key of the split the model is sized from, for messages.
const char* model_data_key(const RunPlan& plan) {
  return plan.options.test_only ? "DATA.TEST" : "DATA.TRAIN";
}

// A split's labels must be outputs of the head: labels past its width could not be scored.
void check_classes_fit_head(const RunPlan& plan, const DataShape& split, const char* key) {
  const int64_t outputs = plan.model.num_classes;
  if (split.num_classes <= outputs) {
    return;
  }
  throw ConfigError(fmt::format(
      "{} has {} classes but the model's head has {} outputs; labels {}..{} could not be "
      "scored. Use data with at most {} classes, or a head with MODEL.HEAD.PARAMS dims ending "
      "in {} (or more)",
      key,
      split.num_classes,
      outputs,
      outputs,
      split.num_classes - 1,
      outputs,
      split.num_classes));
}

// The model is built for the samples of model_data() (after its TRANSFORMS): a training
// run's test split must give the same, and trunks whose weights fix the input size (an MLP's
// first layer, a ViT's position embeddings) take square images only.
void check_data_fits_model(const RunPlan& plan) {
  const std::vector<int64_t>& input = plan.model_data().sample_shape;
  const char* key = model_data_key(plan);
  const std::string& trunk = plan.model.trunk_name;
  if ((trunk == "mlp" || trunk == "vision_transformer") && input[1] != input[2]) {
    throw ConfigError(fmt::format(
        "MODEL.TRUNK.NAME = {} takes square images, but {} yields {} images (after "
        "{}.TRANSFORMS); add a crop with a square size to {}.TRANSFORMS",
        trunk,
        key,
        shape_text(input),
        key,
        key));
  }
  const std::vector<int64_t>& test = plan.test_shape.sample_shape;
  const bool reads_test = plan.options.reads_test_split();
  if (!plan.options.test_only && reads_test && test != input) {
    throw ConfigError(fmt::format(
        "DATA.TEST yields {} images but the model is built for DATA.TRAIN's {} images (both "
        "after their TRANSFORMS){}; make them agree (e.g. the same crop size in "
        "DATA.TEST.TRANSFORMS, or the same dataset), or set TEST_ONLY=True to read DATA.TEST "
        "alone and size the model from it (largo eval sets it; largo extract then writes the "
        "test split only)",
        shape_text(test),
        shape_text(input),
        test[0] != input[0] ? ": the channel counts differ" : ""));
  }
  if (plan.options.self_supervised.enabled()) {
    return; // the head's outputs are embeddings and scores, not classes
  }
  if (!plan.options.test_only) {
    check_classes_fit_head(plan, plan.train_shape, "DATA.TRAIN");
  }
  if (reads_test) {
    check_classes_fit_head(plan, plan.test_shape, "DATA.TEST");
  }
}

// MODEL.TRUNK.MLP.HIDDEN_DIMS: the parameters (float32) within the machine's memory.
void check_mlp_fits_machine(const RunPlan& plan) {
  if (plan.model.trunk_name != "mlp") {
    return;
  }
  const std::vector<int64_t>& shape = plan.model_data().sample_shape;
  uint64_t inputs = saturating_product(
      {static_cast<uint64_t>(shape[0]),
       static_cast<uint64_t>(shape[1]),
       static_cast<uint64_t>(shape[2])});
  uint64_t bytes = 0;
  for (int64_t width : plan.model.mlp.hidden_dims) {
    const uint64_t layer = saturating_product({inputs + 1, static_cast<uint64_t>(width), 4});
    bytes = __builtin_add_overflow(bytes, layer, &bytes) ? UINT64_MAX : bytes;
    inputs = static_cast<uint64_t>(width);
  }
  require_memory(
      bytes,
      fmt::format(
          "MODEL.TRUNK.MLP.HIDDEN_DIMS = [{}] (the MLP's float32 "
          "parameters alone)",
          fmt::join(plan.model.mlp.hidden_dims, ", ")));
}

// The head's width is its own when MODEL.HEAD.PARAMS gives one (a 1000-class model evaluated
// on a 2-class folder keeps its 1000 outputs), else the data's class count.
void fill_model_from_data(RunPlan& plan) {
  models::ModelOptions& model = plan.model;
  const DataShape& data = plan.model_data();
  if (model.in_channels == 0) {
    model.in_channels = data.sample_shape[0];
  }
  if (model.image_size == 0) {
    model.image_size = data.sample_shape[1];
  }
  if (model.num_classes == 0) {
    model.num_classes = !model.head_chain.empty() ? model.head_chain.back().dims.back()
                        : model.head_dims.empty() ? data.num_classes
                                                  : model.head_dims.back();
  }
  model.view_shapes = data.view_shapes;
  check_data_fits_model(plan);
  check_mlp_fits_machine(plan);
  const std::vector<double>& weight = plan.options.loss.weight;
  if (!weight.empty() && static_cast<int64_t>(weight.size()) != model.num_classes) {
    throw config_error(
        "LOSS.cross_entropy_multiple_output_single_target.weight",
        fmt::format("{} values", weight.size()),
        fmt::format("one weight per class: {} values", model.num_classes));
  }
}

// Splits larger than the trunk can only be found with the model in hand (parallelize() finds
// them too, but only once the model is built).
void check_checkpointing_splits(const RunPlan& plan) {
  const auto& checkpointing = plan.options.parallel.activation_checkpointing;
  if (checkpointing.num_splits <= 0 || checkpointing.sequential != "trunk" ||
      !checkpointing.boundaries.empty()) { // a RegNet's stage_checkpoints fit its trunk
    return;
  }
  const int64_t blocks = models::build_model(plan.model)->num_trunk_blocks();
  const int64_t splits = checkpointing.num_splits;
  if (splits < 1 || splits > blocks) {
    throw config_error(
        "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS",
        std::to_string(splits),
        fmt::format(
            "a number of segments from 1 to {} (the {} trunk has {} "
            "blocks)",
            blocks,
            plan.model.trunk_name,
            blocks));
  }
}

// Whether the data-parallel strategy keeps each rank's parameters as flat shards between
// steps (FSDP), so that nothing outside the forward sees them whole.
bool values_flat_sharded(const parallel::ParallelOptions& options) {
  return parallel::data_parallel_placement(options.data_parallelism).value.at("dp") ==
         parallel::Placement::flat_shard();
}

// Whether the data-parallel strategy flat-shards the parameters' values or their optimizer
// state over "dp" (ZeRO-1/2, FSDP): either way it moves the parameters into flat buffers.
bool parameters_in_flat_buffers(const parallel::ParallelOptions& options) {
  return values_flat_sharded(options) ||
         parallel::data_parallel_placement(options.data_parallelism).optimizer_state.at("dp") ==
             parallel::Placement::flat_shard();
}

// TrainerOptions::channels_last for this run: kOn is refused where the parameters live in
// flat (contiguous) buffers, and under a pipeline (its stages send activations between ranks
// as they are laid out); kAuto is on for a convolutional trunk on a CUDA device otherwise (the
// small CNN runs channels-last inside its own stages).
bool resolve_channels_last(const RunPlan& plan) {
  using ChannelsLast = TrainerOptions::ChannelsLast;
  const ChannelsLast asked = plan.options.channels_last;
  std::string unsupported;
  if (parameters_in_flat_buffers(plan.parallel)) {
    unsupported = fmt::format(
        "{}, whose flat parameter buffers hold the weights contiguous",
        parallel::to_string(plan.parallel.data_parallelism));
  } else if (plan.parallel.pipeline.enabled()) {
    unsupported = "a pipeline (not implemented for its stages' activations)";
  }
  if (asked == ChannelsLast::kOn && !unsupported.empty()) {
    throw OptionError("TrainerOptions::channels_last", "on", "off or auto with " + unsupported);
  }
  if (asked != ChannelsLast::kAuto) {
    return asked == ChannelsLast::kOn;
  }
  static const std::set<std::string> convolutional{"resnet", "resnet_sk", "regnet"};
  return unsupported.empty() && device_of(plan.options).is_cuda() &&
         convolutional.count(plan.model.trunk_name) > 0;
}

// TrainerOptions::sync_every_step for this run: kAuto reads every step on the CPU (where a
// read waits for nothing) and with loss scaling (whose skip and scale update the host
// decides), and leaves the results on a CUDA device otherwise; kOff with loss scaling is
// refused.
bool resolve_sync_every_step(const RunPlan& plan) {
  using AutoSwitch = TrainerOptions::AutoSwitch;
  const AutoSwitch asked = plan.options.sync_every_step;
  const bool loss_scaling = plan.precision.loss_scaling != precision::LossScaling::kNone;
  if (asked == AutoSwitch::kOff && loss_scaling) {
    throw OptionError(
        "TrainerOptions::sync_every_step",
        "off",
        "on or auto with loss scaling (float16 mixed precision), whose skip and scale update "
        "the host decides each step");
  }
  if (asked != AutoSwitch::kAuto) {
    return asked == AutoSwitch::kOn;
  }
  return loss_scaling || !device_of(plan.options).is_cuda();
}

// What keeps a run from being captured as one CUDA graph (train/cuda_graph_step.h), the
// first of them; empty when nothing does. The device comes last, so that a machine without a
// GPU tells a config's other obstacles too (and MACHINE.DEVICE cpu is one, where gpu without
// a GPU falls back; resolve_cuda_graph).
std::string cuda_graph_obstacle(const RunPlan& plan) {
  const TrainerOptions& o = plan.options;
  if (plan.world.world_size > 1) {
    return "one process (the collectives of DDP, ZeRO, FSDP, tensor and pipeline parallelism "
           "are not captured yet)";
  }
  if (plan.sync_every_step) {
    return "no host read in the step (MACHINE.SYNC_EVERY_STEP False or auto, without float16's "
           "loss scaling)";
  }
  if (o.optimizer.spec.name != "sgd" || o.optimizer.spec.use_larc) {
    return "OPTIMIZER.name sgd without LARC (SGD's fused CUDA kernel reads its learning rate "
           "from the device; the others read it on the host)";
  }
  if (o.optimizer.weight_decay_schedule || o.optimizer.head_weight_decay_schedule) {
    return "a constant weight decay (a schedule of it is read on the host)";
  }
  if (o.use_grad_clip) {
    return "no MODEL.GRAD_CLIP (its norm is read on the host)";
  }
  if (plan.parallel.activation_checkpointing.enabled()) {
    return "no activation checkpointing (its recompute is not captured yet)";
  }
  if (o.self_supervised.enabled()) {
    return "a classification loss (the self-supervised losses read on the host or keep queues "
           "the host updates)";
  }
  if (o.sync_batch_norm.convert) {
    return "no SyncBatchNorm";
  }
  if (!o.train.drop_last) {
    return "DATA.TRAIN.DROP_LAST True (an epoch's last, smaller batch would change the shapes "
           "the graph replays)";
  }
  if (o.device != "gpu") {
    return "MACHINE.DEVICE gpu";
  }
  return "";
}

// TrainerOptions::cuda_graph for this run: on only where nothing stands in its way. Where
// device gpu finds no GPU the run falls back to the CPU (run_environment.cpp warns), and the
// graph goes with it, warned too.
bool resolve_cuda_graph(const RunPlan& plan) {
  if (!plan.options.cuda_graph) {
    return false;
  }
  const std::string obstacle = cuda_graph_obstacle(plan);
  if (!obstacle.empty()) {
    throw OptionError("TrainerOptions::cuda_graph", "on", "off, or a run with " + obstacle);
  }
  if (!device_of(plan.options).is_cuda()) {
    spdlog::warn("MACHINE.CUDA_GRAPH is True but no CUDA device is visible; the run falls back "
                 "to the CPU, without a graph");
    return false;
  }
  return true;
}

const std::string kFeatureEvalKey = "MODEL.FEATURE_EVAL_SETTINGS.";

// MODEL.FEATURE_EVAL_SETTINGS without EVAL_MODE_ON, or without a freeze switch, builds no
// linear evaluation: its other switches would change nothing.
void check_feature_eval_switches(const models::FeatureEvalOptions& eval) {
  const std::string& key = kFeatureEvalKey;
  const char* lone = !eval.taps.empty()           ? "LINEAR_EVAL_FEAT_POOL_OPS_MAP"
                     : eval.freeze_trunk_only     ? "FREEZE_TRUNK_ONLY"
                     : eval.freeze_trunk_and_head ? "FREEZE_TRUNK_AND_HEAD"
                     : eval.eval_trunk_and_head   ? "EVAL_TRUNK_AND_HEAD"
                                                  : nullptr;
  if (!eval.eval_mode_on && lone != nullptr) {
    throw ConfigError(fmt::format(
        "{}{} is set but {}EVAL_MODE_ON is False, so it would change nothing: set EVAL_MODE_ON "
        "True (with FREEZE_TRUNK_ONLY) for a linear evaluation, or unset {}",
        key,
        lone,
        key,
        lone));
  }
  if (eval.freeze_trunk_only && eval.freeze_trunk_and_head) {
    throw ConfigError(fmt::format(
        "{0}FREEZE_TRUNK_ONLY and {0}FREEZE_TRUNK_AND_HEAD are both True: choose one (the "
        "heads train with FREEZE_TRUNK_ONLY, nothing trains with FREEZE_TRUNK_AND_HEAD)",
        key));
  }
  if (eval.eval_mode_on && !eval.enabled() && !eval.taps.empty()) {
    throw ConfigError(fmt::format(
        "{0}LINEAR_EVAL_FEAT_POOL_OPS_MAP needs {0}FREEZE_TRUNK_ONLY (or FREEZE_TRUNK_AND_HEAD): "
        "heads on tapped features of a trunk that trains are not available",
        key));
  }
}

// A linear evaluation (models/linear_eval.h): what it can run with.
void check_linear_evaluation(const RunPlan& plan) {
  const TrainerOptions& o = plan.options;
  const models::FeatureEvalOptions& eval = plan.model.feature_eval;
  check_feature_eval_switches(eval);
  if (!eval.enabled()) {
    return;
  }
  const std::string& key = kFeatureEvalKey;
  if (eval.freeze_trunk_and_head && !o.test_only) {
    throw ConfigError(fmt::format(
        "{}FREEZE_TRUNK_AND_HEAD freezes every parameter, so training would change nothing: "
        "use it with TEST_ONLY True, or FREEZE_TRUNK_ONLY to train the heads",
        key));
  }
  auto refuse_with = [&](const std::string& what, const std::string& why) {
    throw ConfigError(fmt::format(
        "{}EVAL_MODE_ON (a linear evaluation) with {} is not available: {}", key, what, why));
  };
  if (values_flat_sharded(o.parallel)) {
    refuse_with(
        "FSDP (MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP)",
        "FSDP shards trained units, and the frozen trunk is none; use DDP or ZeRO-1/2");
  }
  if (o.parallel.activation_checkpointing.enabled()) {
    refuse_with(
        "MODEL.ACTIVATION_CHECKPOINTING",
        "the frozen trunk runs without gradients and keeps no activations to save");
  }
  const auto& tappable = models::tappable_trunk_names();
  const bool can_tap =
      std::find(tappable.begin(), tappable.end(), plan.model.trunk_name) != tappable.end();
  if (!eval.taps.empty() && !can_tap) {
    throw ConfigError(fmt::format(
        "{}LINEAR_EVAL_FEAT_POOL_OPS_MAP taps features VISSL names inside a {} trunk, but "
        "MODEL.TRUNK.NAME is {}: use one of those, or leave the map empty to train the model's "
        "own head",
        key,
        fmt::join(tappable, ", "),
        plan.model.trunk_name));
  }
  const int64_t classes = std::max(plan.train_shape.num_classes, plan.test_shape.num_classes);
  for (size_t i = 0; i < eval.heads.size(); ++i) {
    if (eval.heads[i].dims.back() < classes) {
      throw ConfigError(fmt::format(
          "MODEL.HEAD.PARAMS[{}] ends in {} outputs but the data has {} classes: end its dims in "
          "{}",
          i,
          eval.heads[i].dims.back(),
          classes,
          classes));
    }
  }
}

// One or more crop indices, each below `num_crops`.
bool crops_in_range(const std::vector<int64_t>& crops, size_t num_crops) {
  return !crops.empty() && std::all_of(crops.begin(), crops.end(), [&](int64_t crop) {
    return crop >= 0 && crop < static_cast<int64_t>(num_crops);
  });
}

// Several views per image and a self-supervised loss go together (self_supervised.md).
void check_views_match_loss(const RunPlan& plan) {
  const SelfSupervisedLossOptions& ssl = plan.options.self_supervised;
  const auto& views = plan.train_shape.view_shapes;
  if (!ssl.enabled()) {
    if (!views.empty()) {
      throw ConfigError(fmt::format(
          "DATA.TRAIN.TRANSFORMS make {} views of each image, which only a self-supervised "
          "loss trains on: set LOSS.name to swav_loss, simclr_info_nce_loss, barlow_twins_loss or "
          "moco_loss, "
          "or use a one-image TRANSFORMS list (e.g. RandomResizedCrop)",
          views.size()));
    }
    return;
  }
  if (views.empty()) {
    throw ConfigError(fmt::format(
        "LOSS.name = {} trains on several views of each image, but DATA.TRAIN.TRANSFORMS make "
        "one: add ImgPilToMultiCrop (SwAV, DINO, DeepCluster v2) or ImgReplicatePil (SimCLR, "
        "Barlow Twins, MoCo) "
        "with "
        "COLLATE_FUNCTION multicrop_collator or simclr_collator (configs/examples/)",
        ssl.name));
  }
  if (ssl.compares_two_views() && (views.size() != 2 || views[0] != views[1])) {
    throw ConfigError(fmt::format(
        "LOSS.name = {} compares 2 views of one size per image, but "
        "DATA.TRAIN.TRANSFORMS make {} views; use ImgReplicatePil with num_times 2 and a "
        "fixed-size crop",
        ssl.name,
        views.size()));
  }
  const auto& assign = ssl.swav.crops_for_assign;
  const bool assign_ok = crops_in_range(assign, views.size());
  const auto& mb = ssl.deepclusterv2_memory.crops_for_mb;
  if (ssl.is_deepclusterv2() && !crops_in_range(mb, views.size())) {
    throw config_error(
        "LOSS.deepclusterv2_loss.memory_params.crops_for_mb",
        fmt::format("[{}]", fmt::join(mb, ", ")),
        fmt::format(
            "crop indices in [0, {}): DATA.TRAIN.TRANSFORMS make {} crops",
            views.size(),
            views.size()));
  }
  if (ssl.is_swav() && !assign_ok) {
    throw config_error(
        "LOSS.swav_loss.crops_for_assign",
        fmt::format("[{}]", fmt::join(assign, ", ")),
        fmt::format(
            "crop indices in [0, {}): DATA.TRAIN.TRANSFORMS make {} crops",
            views.size(),
            views.size()));
  }
}

// LABEL_TYPE sample_index makes every label an image's index: only a loss that ignores the
// labels can train on it, and no split it labels can be evaluated.
void check_label_types(const TrainerOptions& o) {
  if (o.train.source.label_type == "sample_index" && !o.self_supervised.enabled()) {
    throw ConfigError(std::string(
        "DATA.TRAIN.LABEL_TYPE = sample_index gives each image its index as label, which only a "
        "self-supervised loss (LOSS.name swav_loss, simclr_info_nce_loss, barlow_twins_loss or "
        "moco_loss) can "
        "train with; a classification loss needs standard labels"));
  }
  // VISSL's DeepClusterV2Loss takes its targets' images from the labels.
  if (o.self_supervised.is_deepclusterv2() && o.train.source.label_type != "sample_index") {
    throw config_error(
        "DATA.TRAIN.LABEL_TYPE",
        o.train.source.label_type,
        "sample_index with LOSS.name = deepclusterv2_loss: the loss finds each image's cluster "
        "and memory row by its index, which that label type gives (as in VISSL's configs)");
  }
  if (o.reads_test_split() && o.test.source.label_type == "sample_index") {
    throw ConfigError(
        "DATA.TEST.LABEL_TYPE = sample_index: the test split is scored against its labels, "
        "which would be image indices; use standard");
  }
}

// DINO's teacher and MoCo's momentum encoder are whole float32 models on every rank, built
// and updated from the module's parameters: as they are after ZeRO-1/2's step (gathered back),
// or from FSDP's gathered whole values (SelfSupervisedLoss::before_step). What else splits or
// casts the model is refused.
void check_momentum_copy_composes(const RunPlan& plan) {
  const TrainerOptions& o = plan.options;
  const std::string& loss = o.self_supervised.name;
  const std::string copy =
      o.self_supervised.is_dino() ? "DINO's teacher" : "MoCo's momentum encoder";
  auto refuse = [&](const std::string& what, const std::string& why) {
    throw ConfigError(fmt::format(
        "LOSS.name = {} with {} is not available in this version of Largo: {}", loss, what, why));
  };
  if (o.parallel.fsdp.compute_dtype) {
    refuse(
        "FSDP's compute copies (MODEL.FSDP_CONFIG.AMP_TYPE O2 or compute_dtype float16 / "
        "bfloat16)",
        copy + " stays float32 beside the low-precision compute copies; set "
               "MODEL.FSDP_CONFIG.AMP_TYPE O1 and compute_dtype float32 (autocast)");
  }
  if (o.parallel.tensor_parallel_size > 1) {
    refuse(
        "DISTRIBUTED.TENSOR_PARALLEL_SIZE > 1",
        copy + " is not split across the tensor-parallel ranks; use DDP, ZeRO or FSDP");
  }
  if (o.parallel.offload_optimizer) {
    refuse(
        "the optimizer offloaded to the host",
        copy + " is not updated from offloaded parameters; set OPTIMIZER.offload_optimizer "
               "and MODEL.FSDP_CONFIG.offload_optimizer False");
  }
  if (plan.precision.cast_model) {
    refuse(
        "Apex O2/O3 (MODEL.AMP_PARAMS)",
        copy + " stays float32 beside the cast model; use O1 (autocast) or O0");
  }
}

// DINO: a dino_head, and teacher crops that are crops of the data, of one size.
void check_dino_fits(const RunPlan& plan) {
  const SelfSupervisedLossOptions& ssl = plan.options.self_supervised;
  if (plan.model.dino_head.in_dim == 0) {
    throw ConfigError("LOSS.name = dino_loss with MODEL.HEAD.PARAMS without a dino_head: set "
                      "[[\"dino_head\", {\"in_dim\": trunk width, \"num_clusters\": [65536]}]]");
  }
  const auto& views = plan.train_shape.view_shapes;
  const auto& crops = ssl.dino.crops_for_teacher;
  const bool crops_ok = std::all_of(crops.begin(), crops.end(), [&](int64_t crop) {
    return crop >= 0 && crop < static_cast<int64_t>(views.size()) && views[crop] == views[crops[0]];
  });
  if (views.size() < 2 || !crops_ok) {
    throw config_error(
        "LOSS.dino_loss.crops_for_teacher",
        fmt::format("[{}]", fmt::join(crops, ", ")),
        fmt::format(
            "crop indices in [0, {}) of one size (the global crops), with at least 2 crops: "
            "DATA.TRAIN.TRANSFORMS make {} crops",
            views.size(),
            views.size()));
  }
}

// VISSL's assertion: each loss call writes the keys of every replica's micro-batch into the
// queue in one piece, which must not wrap around its end.
void check_moco_queue_size(const RunPlan& plan, int64_t keys_per_call) {
  const SelfSupervisedLossOptions& ssl = plan.options.self_supervised;
  if (ssl.is_moco() && ssl.moco_queue_size % keys_per_call != 0) {
    throw config_error(
        "LOSS.moco_loss.queue_size",
        std::to_string(ssl.moco_queue_size),
        fmt::format(
            "a multiple of the keys each step writes into the queue ({} = "
            "BATCHSIZE_PER_REPLICA x {} data-parallel rank(s)), as VISSL asserts",
            keys_per_call,
            keys_per_call / plan.batch_per_rank));
  }
}

// What a self-supervised run composes with; each refusal says what to change.
void check_self_supervised(const RunPlan& plan) {
  const TrainerOptions& o = plan.options;
  const SelfSupervisedLossOptions& ssl = o.self_supervised;
  if (!ssl.enabled()) {
    if (!ssl.frozen_parameters.empty()) {
      throw ConfigError(
          "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP freezes parameters of a self-supervised run "
          "(LOSS.name swav_loss, simclr_info_nce_loss, barlow_twins_loss or moco_loss); leave it "
          "empty "
          "([]) otherwise");
    }
    // A classifier's heads may run one after another (mlp heads, or a swav_head without
    // prototypes as the projection before them): the last one's outputs are the classes.
    if (!plan.model.swav_head.dims.empty() || plan.model.dino_head.in_dim > 0) {
      throw ConfigError(
          "MODEL.HEAD.PARAMS holds a swav_head with prototypes or a dino_head, which only a "
          "self-supervised loss trains (LOSS.name swav_loss or dino_loss); a classifier takes "
          "mlp heads (a swav_head without prototypes may come first, as the projection), or "
          "several in a linear evaluation "
          "(MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP)");
    }
    check_views_match_loss(plan);
    return;
  }
  auto refuse = [&](const std::string& what, const std::string& why) {
    throw ConfigError(fmt::format("LOSS.name = {} with {}: {}", ssl.name, what, why));
  };
  if (o.test_model || o.test_only) {
    refuse(
        "TEST_MODEL True",
        "a self-supervised loss has no classes to score; set TEST_MODEL "
        "False and evaluate the trunk linearly afterwards "
        "(MODEL.FEATURE_EVAL_SETTINGS, docs/self_supervised.md)");
  }
  if (plan.model.feature_eval.enabled()) {
    refuse(
        "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON",
        "pretrain first, then evaluate linearly "
        "in a second run");
  }
  if (ssl.is_swav() && plan.model.swav_head.dims.empty()) {
    refuse(
        "MODEL.HEAD.PARAMS without a swav_head",
        "set [[\"swav_head\", {\"dims\": [trunk width, 2048, 128], \"num_clusters\": [3000]}]]");
  }
  const models::ModelOptions& model = plan.model;
  const int64_t head_width = !model.head_chain.empty()  ? model.head_chain.back().dims.back()
                             : !model.head_dims.empty() ? model.head_dims.back()
                                                        : 0;
  if (ssl.trains_projection() && head_width != ssl.projection_width()) {
    refuse(
        fmt::format("{} = {}", ssl.projection_width_key(), ssl.projection_width()),
        head_width == 0
            ? std::string("the loss needs a projection head: set MODEL.HEAD.PARAMS to "
                          "mlp heads, e.g. [[\"mlp\", {\"dims\": [2048, 2048], "
                          "\"use_relu\": True}], [\"mlp\", {\"dims\": [2048, 128]}]]")
            : fmt::format(
                  "the projection head ends in {} outputs; make the two agree", head_width));
  }
  if (ssl.trains_projection() && !plan.model.swav_head.dims.empty()) {
    refuse("a swav_head", "the projection is one or more mlp heads in MODEL.HEAD.PARAMS");
  }
  if (o.parallel.pipeline.enabled()) {
    refuse(
        "DISTRIBUTED.PIPELINE_SIZE > 1",
        "not available in this version of Largo (the views of several resolutions run "
        "through the whole trunk); use data parallelism");
  }
  if (ssl.is_moco() || ssl.is_dino()) {
    check_momentum_copy_composes(plan);
  }
  if (ssl.is_dino()) {
    check_dino_fits(plan);
  } else if (plan.model.dino_head.in_dim > 0) {
    refuse("a dino_head", "it is DINO's head; set LOSS.name to dino_loss, or use another head");
  }
  if (ssl.is_swav() && ssl.normalize_last_layer && plan.precision.cast_model) {
    refuse(
        "LOSS.swav_loss.normalize_last_layer under Apex O2/O3",
        "the prototypes are normalised in the module, which O2's float32 masters overwrite; "
        "use O1 (autocast)");
  }
  const auto& views = plan.train_shape.view_shapes;
  const bool one_size = std::all_of(
      views.begin(), views.end(), [&](const auto& shape) { return shape == views.front(); });
  const std::string& trunk = plan.model.trunk_name;
  // A ViT takes other sizes by interpolating its positional embedding, which VISSL does
  // with a class token only (models/vit_position_interpolation.h).
  const bool vit = trunk == "vision_transformer";
  const bool takes_any_size = trunk == "resnet" || trunk == "resnet_sk" || trunk == "regnet" ||
                              (vit && models::has_class_token(plan.model.vit));
  if (!one_size && !takes_any_size) {
    refuse(
        fmt::format("views of several sizes and MODEL.TRUNK.NAME = {}", trunk),
        vit ? "a vision_transformer without a class token takes only the size its positional "
              "embedding was built for, as in VISSL; set "
              "MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN True and CLASSIFIER token, or "
              "crops of one size"
            : "only the resnet, regnet and vision_transformer (with a class token) trunks "
              "(and resnet_sk) take "
              "any image size; use one of them, or crops of one size");
  }
  check_views_match_loss(plan);
}

void scale_learning_rates(RunPlan& plan) {
  const OptimizerOptions& optimizer = plan.options.optimizer;
  plan.lr = optimizer.lr;
  optim::apply_auto_lr_scaling(
      plan.lr, optimizer.lr_scaling, plan.global_batch, plan.batch_per_node);
  plan.lr_head = plan.lr;
  if (optimizer.head_use_different_lr) {
    plan.lr_head = optimizer.lr_head;
    optim::apply_auto_lr_scaling(
        plan.lr_head, optimizer.lr_head_scaling, plan.global_batch, plan.batch_per_node);
  }
}

// resolve_run's plan, its errors in the library's option names.
RunPlan plan_run(TrainerOptions options, RunWorld world);

} // namespace

parallel::WrapPolicy trunk_block_units(int64_t auto_wrap_threshold) {
  return parallel::WrapPolicy::elements_of("trunk") &&
         parallel::WrapPolicy::min_trainable_parameters(auto_wrap_threshold);
}

parallel::ParallelOptions trainer_parallel_defaults() {
  parallel::ParallelOptions defaults;
  defaults.fsdp.wrap_policy = trunk_block_units(0);
  defaults.fsdp.keeps_fp32 = [](const torch::nn::Module& module) {
    return precision::is_batchnorm(module); // Apex's keep_batchnorm_fp32
  };
  return defaults;
}

std::string process_group_backend(const TrainerOptions& options) {
  return options.distributed.backend == "nccl" && device_of(options).is_cuda() ? "nccl" : "gloo";
}

DataShape data_shape_of(const data::DataSplitOptions& split) {
  const data::DatasetShape shape = data::peek_dataset_shape(split.source);
  return DataShape{shape.sample_shape, shape.num_classes, shape.view_shapes};
}

RunPlan resolve_run(const Config& config) {
  TrainerOptions options = trainer_options_from_config(config);
  RunWorld world;
  if (auto environment = comm::world_from_environment()) {
    world.world_size = environment->world_size;
    world.procs_per_node = std::max(1, environment->local_world_size);
  } else {
    world.procs_per_node = static_cast<int>(config.get_int("DISTRIBUTED.NUM_PROC_PER_NODE"));
    world.world_size =
        static_cast<int>(config.get_int("DISTRIBUTED.NUM_NODES")) * world.procs_per_node;
  }
  world.backend = process_group_backend(options);
  if (world.backend == "nccl" && world.world_size > 1 && !comm::ProcessGroup::nccl_built()) {
    throw config_error(
        "DISTRIBUTED.BACKEND",
        "nccl",
        "gloo: this build of Largo has no NCCL, having been built against a "
        "libtorch without CUDA (docs/distributed.md, GPUs and NCCL)");
  }
  return resolve_run(std::move(options), world);
}

RunPlan resolve_run(TrainerOptions options, RunWorld world) {
  // The library's errors name its options; the plan's options came from YAML keys.
  return rethrow_with_yaml_keys([&] { return plan_run(std::move(options), world); });
}

namespace {

RunPlan plan_run(TrainerOptions options, RunWorld world) {
  RunPlan plan;
  plan.options = std::move(options);
  plan.world = world;
  const TrainerOptions& o = plan.options;
  check_model_ema_keys(o);
  if (o.test_only && !o.test_model) {
    throw config_error(
        "TEST_MODEL",
        "False",
        "True with TEST_ONLY = True: an evaluation-only run evaluates DATA.TEST");
  }
  plan.precision = precision::resolve_precision_policy(o.amp);
  // The device the config asks for: a GPU config validates on a machine without one too.
  precision::check_policy_supported_on(
      plan.precision, o.device == "gpu" ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU));
  // After data_config's checks, what peeking refuses is a split's TRANSFORMS (an unknown
  // name, arguments that do not fit the images): said with the key.
  auto shape_of = [](const data::DataSplitOptions& split, const std::string& key) {
    try {
      return data_shape_of(split);
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("config key {}.TRANSFORMS: {}", key, e.what()));
    }
  };
  if (!o.test_only) { // an evaluation reads DATA.TEST only: DATA.TRAIN need not exist
    plan.train_shape = shape_of(o.train, "DATA.TRAIN");
  }
  if (o.reads_test_split()) {
    plan.test_shape = shape_of(o.test, "DATA.TEST");
  }
  plan.model = o.model;
  check_label_types(plan.options);
  check_self_supervised(plan);
  fill_model_from_data(plan);
  check_checkpointing_splits(plan);
  check_linear_evaluation(plan);
  check_pipeline_keys(plan);
  plan.parallel = parallel_options_of(plan);
  rethrow_with_yaml_keys(
      [&] { parallel::check_parallel_options(plan.parallel, world.world_size); });
  plan.channels_last = rethrow_with_yaml_keys([&] { return resolve_channels_last(plan); });
  plan.sync_every_step = rethrow_with_yaml_keys([&] { return resolve_sync_every_step(plan); });
  plan.cuda_graph = rethrow_with_yaml_keys([&] { return resolve_cuda_graph(plan); });

  // The ranks of a replica (a pipeline's stages, a layer's tensor-parallel shards) share its
  // batch: the mesh's data replicas make the global batch, and a node holds procs_per_node /
  // (ranks per replica) of them (at least a part of one).
  const int64_t accumulation = o.gradient_accumulation_steps;
  const int replicas = data_replicas(plan);
  const int ranks_per_replica = world.world_size / replicas;
  const int64_t replicas_per_node = std::max(1, world.procs_per_node / ranks_per_replica);
  plan.batch_per_rank = o.train.batch_size;
  plan.batch_per_node = plan.batch_per_rank * replicas_per_node * accumulation;
  plan.global_batch = plan.batch_per_rank * replicas * accumulation;
  check_moco_queue_size(plan, plan.batch_per_rank * replicas);
  scale_learning_rates(plan);
  return plan;
}

} // namespace

void refuse_extraction_keys(const RunPlan& plan) {
  if (plan.model.feature_eval.extract_trunk_features_only) {
    throw ConfigError(
        "MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY = True is read by `largo "
        "extract` (it writes the trunk's features to files); unset it for training or "
        "evaluation");
  }
}

const DataShape& RunPlan::model_data() const {
  return options.test_only ? test_shape : train_shape;
}

std::string RunPlan::describe() const {
  const int replicas = data_replicas(*this);
  std::string layout =
      world.world_size == 1
          ? "one process"
          : fmt::format(
                "{} over {} ranks ({})",
                parallel::to_string(parallel.data_parallelism),
                replicas,
                world.backend);
  const bool replicas_span_ranks = parallel.pipeline.enabled() || parallel.tensor_parallel_size > 1;
  if (replicas_span_ranks && replicas == 1) {
    layout = "1 replica";
  }
  if (parallel.tensor_parallel_size > 1) {
    layout =
        fmt::format("tensor parallel over {} ranks x {}", parallel.tensor_parallel_size, layout);
  }
  if (parallel.pipeline.enabled()) {
    layout = fmt::format(
        "pipeline of {} stages ({}, {} micro-batches) x {}",
        parallel.pipeline.size,
        parallel::to_string(parallel.pipeline.stages.schedule()),
        parallel.pipeline.stages.num_microbatches(),
        layout);
  }
  return fmt::format(
      "{}{}{}, {}, global batch {} = {} per rank x {} {} x {} accumulation step(s)",
      precision.describe(),
      channels_last ? ", channels-last" : "",
      sync_every_step ? ""
                      : (cuda_graph ? ", the step as one CUDA graph" : ", no host sync per step"),
      layout,
      global_batch,
      batch_per_rank,
      replicas,
      replicas_span_ranks ? "replica(s)" : "rank(s)",
      options.gradient_accumulation_steps);
}

} // namespace largo::train
