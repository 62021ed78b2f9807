#include <largo/train/trainer_config.h>

#include "config_checks.h"
#include "optimizer_schedule_config.h"
#include "parallel_config.h"
#include "self_supervised_config.h"

#include <largo/core/config_value.h>
#include <largo/core/resources.h>
#include <largo/parallel/data_parallel/sync_batch_norm.h>
#include <largo/precision/model_cast.h>
#include <largo/train/data_config.h>
#include <largo/train/option_keys.h>
#include <largo/train/unavailable_keys.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace largo::train {
namespace {

// Process and thread counts beyond the machine are refused before anything starts them.
void require_count_within_machine(
    const std::string& key, int64_t value, int64_t limit, const std::string& rule) {
  if (value > limit) {
    throw ResourceError(fmt::format(
        "config key {} = {}: this machine gives the process {} cores, so at most {} ({})",
        key,
        value,
        available_cpu_cores(),
        limit,
        rule));
  }
}

// OPTIMIZER.base_optimizer (ZeRO) holds a copy of OPTIMIZER's own keys, as VISSL writes it:
// anything else is a typo to report rather than a setting to drop silently.
void check_base_optimizer_keys(const Config& config) {
  const YAML::Node base = config.node("OPTIMIZER.base_optimizer");
  if (!base.IsMap()) {
    throw config_error(
        "OPTIMIZER.base_optimizer",
        "(not a map)",
        "a map of optimizer settings, e.g. {name: sgd, momentum: 0.9}");
  }
  for (const auto& item : base) {
    const std::string key = item.first.as<std::string>();
    if (key == "base_optimizer" || key == "offload_optimizer" || !config.has("OPTIMIZER." + key)) {
      throw config_error(
          "OPTIMIZER.base_optimizer." + key,
          "(given)",
          "a key of OPTIMIZER: name, momentum, nesterov, dampening, weight_decay, "
          "betas, eps, amsgrad, eta, exclude_bias_and_norm, use_larc or larc_config");
    }
    if (item.second.IsMap()) {
      for (const auto& nested : item.second) {
        const std::string nested_key = key + "." + nested.first.as<std::string>();
        if (!config.has("OPTIMIZER." + nested_key)) {
          throw config_error(
              "OPTIMIZER.base_optimizer." + nested_key, "(given)", "a key of OPTIMIZER." + key);
        }
      }
    }
  }
}

// VISSL's other losses (its registry in vissl/losses), named as what they are rather than as
// an unexpected value.
void refuse_other_vissl_losses(const std::string& loss) {
  static const std::vector<std::string> vissl_losses = {
      "bce_logits_multiple_output_single_target",
      "dino_distillation_loss",
      "distillation_loss",
      "ibot_distillation_loss",
      "ibot_loss",
      "msn_distillation_loss",
      "msn_loss",
      "multicrop_simclr_info_nce_loss",
      "nce_loss_with_memory",
      "swav_distillation_loss",
      "swav_momentum_loss"};
  if (std::find(vissl_losses.begin(), vissl_losses.end(), loss) != vissl_losses.end()) {
    throw ConfigError(fmt::format(
        "config key LOSS.name = {}: VISSL's {} is not available in this version of Largo "
        "(it trains classifiers with CrossEntropyLoss or "
        "cross_entropy_multiple_output_single_target, and pretrains with swav_loss, "
        "simclr_info_nce_loss, barlow_twins_loss, moco_loss, dino_loss or deepclusterv2_loss)",
        loss,
        loss));
  }
}

// MODEL.AMP_PARAMS: the policy, its loss scaler, and Apex's AMP_ARGS (an open map).
void amp_options_from(const Config& config, TrainerOptions& options) {
  auto& amp = options.amp;
  amp.use_amp = config.get_bool("MODEL.AMP_PARAMS.USE_AMP");
  amp.amp_type = config.get_string("MODEL.AMP_PARAMS.AMP_TYPE");
  amp.dtype = config.get_string("MODEL.AMP_PARAMS.DTYPE");
  const std::string scaler = "MODEL.AMP_PARAMS.GRAD_SCALER.";
  auto& grad_scaler = options.grad_scaler;
  grad_scaler.init_scale = config.get_double(scaler + "INIT_SCALE");
  grad_scaler.growth_factor = config.get_double(scaler + "GROWTH_FACTOR");
  grad_scaler.backoff_factor = config.get_double(scaler + "BACKOFF_FACTOR");
  grad_scaler.growth_interval = config.get_int(scaler + "GROWTH_INTERVAL");
  grad_scaler.hysteresis = config.get_int(scaler + "HYSTERESIS");
  grad_scaler.min_loss_scale = config.get_double(scaler + "MIN_LOSS_SCALE");
  // Apex caps its dynamic scale at 2^24 (a larger INIT_SCALE raises the cap to it);
  // PyTorch's GradScaler has no cap.
  grad_scaler.max_loss_scale = amp.amp_type == "apex" ? std::max(16777216.0, grad_scaler.init_scale)
                                                      : std::numeric_limits<double>::infinity();

  const std::string args_key = "MODEL.AMP_PARAMS.AMP_ARGS";
  const YAML::Node args = config.node(args_key);
  if (!args.IsMap()) {
    throw config_error(args_key, "(not a map)", "a map such as {\"opt_level\": \"O1\"}");
  }
  for (const auto& entry : args) {
    const std::string name = entry.first.as<std::string>();
    const std::string key = args_key + "." + name;
    const YAML::Node& value = entry.second;
    if (name == "opt_level") {
      require(value.IsScalar(), key, "(not a string)", "O0, O1, O2 or O3");
      amp.opt_level = value.Scalar();
    } else if (name == "keep_batchnorm_fp32") {
      amp.keep_batchnorm_fp32 = yaml_to_bool(value, key);
    } else if (name == "master_weights") {
      amp.master_weights = yaml_to_bool(value, key);
    } else if (name == "loss_scale") {
      require(value.IsScalar(), key, "(not a scalar)", "\"dynamic\" or a number > 0");
      amp.loss_scale = value.Scalar();
    } else if (name == "min_loss_scale") {
      grad_scaler.min_loss_scale = yaml_to_double(value, key);
    } else if (name == "max_loss_scale") {
      grad_scaler.max_loss_scale = yaml_to_double(value, key);
    } else {
      throw config_error(
          key,
          "(given)",
          "one of the Apex options Largo implements: opt_level, "
          "keep_batchnorm_fp32, master_weights, loss_scale, min_loss_scale, "
          "max_loss_scale");
    }
  }
  options.tf32.matmul = config.get_bool("MACHINE.ALLOW_TF32_MATMUL");
  options.tf32.cudnn = config.get_bool("MACHINE.ALLOW_TF32_CUDNN");
}

// LOSS.name: a classification loss or one of the self-supervised ones Largo has.
void check_loss_name(const Config& config) {
  const std::string loss = config.get_string("LOSS.name");
  refuse_other_vissl_losses(loss);
  require(
      loss == "CrossEntropyLoss" || loss == "cross_entropy_multiple_output_single_target" ||
          loss == "swav_loss" || loss == "simclr_info_nce_loss" || loss == "barlow_twins_loss" ||
          loss == "moco_loss" || loss == "dino_loss" || loss == "deepclusterv2_loss",
      "LOSS.name",
      loss,
      "CrossEntropyLoss or cross_entropy_multiple_output_single_target (classification), or "
      "swav_loss, simclr_info_nce_loss, barlow_twins_loss, moco_loss, dino_loss or "
      "deepclusterv2_loss (self-supervised)");
}

// ZeRO (OPTIMIZER.name: zero, as the VISSL docs write it, or use_zero: True; with
// MODEL.SHARDED_DDP_SETUP.USE_SDP, or VISSL's ShardedDDP task beside the ZeRO optimizer, its
// gradients sharded too). Returns whether the optimizer state is sharded, and so whether
// OPTIMIZER.base_optimizer describes the optimizer.
bool zero_options_from(const Config& config, TrainerOptions& options) {
  const bool zero_by_name = config.get_string("OPTIMIZER.name") == "zero";
  const bool zero_optimizer = zero_by_name || config.get_bool("OPTIMIZER.use_zero");
  // USE_SDP sets the task and use_zero in VISSL; AUTO_SETUP_FSDP replaces the task by FSDP's.
  const bool sdp_task = vissl_task(config) == VisslTask::kShardedDdp &&
                        !config.get_bool("MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP");
  const bool use_sdp = config.get_bool("MODEL.SHARDED_DDP_SETUP.USE_SDP");
  require(
      !sdp_task || zero_optimizer || use_sdp,
      "TRAINER.TASK_NAME",
      "self_supervision_sdp_task",
      "self_supervision_task without the ZeRO optimizer: VISSL's ShardedDDP task runs only "
      "beside it (set OPTIMIZER.use_zero True for ZeRO stage 2, or "
      "MODEL.SHARDED_DDP_SETUP.USE_SDP True, which sets both)");
  const bool shard_gradients = use_sdp || sdp_task;
  const bool shard_optimizer_state = zero_optimizer || shard_gradients;
  if (shard_optimizer_state) {
    options.parallel.data_parallelism =
        shard_gradients ? parallel::DataParallelism::kZero2 : parallel::DataParallelism::kZero1;
  }
  const int64_t reduce_buffer_size = config.get_int("MODEL.SHARDED_DDP_SETUP.reduce_buffer_size");
  require(
      reduce_buffer_size == -1 || reduce_buffer_size > 0,
      "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size",
      std::to_string(reduce_buffer_size),
      "-1 (FairScale's default, 2^23 elements) or a number of elements > 0");
  if (reduce_buffer_size > 0) { // in elements of float32 gradients
    options.parallel.zero.reduce_buffer_bytes =
        reduce_buffer_size * static_cast<int64_t>(sizeof(float));
  }
  if (shard_optimizer_state) {
    check_base_optimizer_keys(config);
  }
  // FSDP's is MODEL.FSDP_CONFIG.offload_optimizer (fsdp_options_from).
  options.parallel.offload_optimizer = config.get_bool("OPTIMIZER.offload_optimizer");
  require(
      !options.parallel.offload_optimizer || shard_optimizer_state,
      "OPTIMIZER.offload_optimizer",
      "True",
      "False without ZeRO: the sharded optimizer is offloaded (turn on OPTIMIZER.use_zero or "
      "MODEL.SHARDED_DDP_SETUP.USE_SDP; under FSDP set MODEL.FSDP_CONFIG.offload_optimizer)");
  return shard_optimizer_state;
}

// VISSL passes OPTIMIZER's keys to the optimizer it names, which reads its own: a key that
// the named optimizer would ignore is refused at any value but its default. `name` is the
// optimizer built (sgd_fsdp builds sgd); `optimizer_key` names a key of OPTIMIZER or
// base_optimizer.
void refuse_keys_the_optimizer_ignores(
    const Config& config,
    const std::function<std::string(const std::string&)>& optimizer_key,
    const std::string& name) {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> readers = {
      {"momentum", {"sgd", "rmsprop", "lars"}},
      {"nesterov", {"sgd"}},
      {"dampening", {"sgd"}},
      {"betas", {"adam", "adamw", "lamb"}},
      {"eps", {"adam", "adamw", "rmsprop", "lamb"}},
      {"amsgrad", {"adam", "adamw"}},
      {"alpha", {"rmsprop"}},
      {"centered", {"rmsprop"}},
      {"eta", {"lars"}},
      {"exclude_bias_and_norm", {"lars"}},
  };
  static const Config defaults = Config::defaults();
  for (const auto& [key, optimizers] : readers) {
    if (std::find(optimizers.begin(), optimizers.end(), name) != optimizers.end()) {
      continue;
    }
    const std::string full_key = optimizer_key(key);
    const YAML::Node default_value = defaults.node("OPTIMIZER." + key);
    require(
        same_config_value(config.node(full_key), default_value),
        full_key,
        config_value_text(config.node(full_key)),
        fmt::format(
            "{} (its default) unless the optimizer is {}: {} does not read it{}",
            config_value_text(default_value),
            fmt::join(optimizers, " or "),
            name,
            key == "exclude_bias_and_norm"
                ? " (LARC's is OPTIMIZER.larc_config.exclude_bias_and_norm)"
                : ""));
  }
}

// lars's keys: momentum in [0, 1) as VISSL requires, eta > 0.
void lars_options_from(
    const Config& config,
    const std::function<std::string(const std::string&)>& optimizer_key,
    OptimizerOptions& optimizer) {
  optim::OptimizerSpec& spec = optimizer.spec;
  const std::string momentum_key = optimizer_key("momentum");
  spec.lars.momentum = config.get_double(momentum_key);
  require(
      spec.lars.momentum >= 0.0 && spec.lars.momentum < 1.0,
      momentum_key,
      fmt::format("{}", spec.lars.momentum),
      "a number in [0, 1) for lars (VISSL's rule)");
  const std::string eta_key = optimizer_key("eta");
  const double eta = config.get_double(eta_key);
  require(eta > 0.0 && std::isfinite(eta), eta_key, fmt::format("{}", eta), "a number > 0");
  spec.lars.eta = eta;
  optimizer.lars_exclude_bias_and_norm = config.get_bool(optimizer_key("exclude_bias_and_norm"));
}

// rmsprop's keys (ClassyVision's RMSProp passes them to torch.optim.RMSprop; the optimizer
// validates them: optim/rmsprop.h). VISSL's default momentum, 0.9, applies to rmsprop too.
void rmsprop_options_from(
    const Config& config,
    const std::function<std::string(const std::string&)>& optimizer_key,
    optim::RMSpropOptions& rmsprop) {
  rmsprop.alpha = config.get_double(optimizer_key("alpha"));
  rmsprop.eps = config.get_double(optimizer_key("eps"));
  rmsprop.momentum = config.get_double(optimizer_key("momentum"));
  rmsprop.centered = config.get_bool(optimizer_key("centered"));
}

// The optimizer OPTIMIZER.name (or base_optimizer.name under ZeRO) names: one of Largo's, or
// VISSL's sgd_fsdp, its SGD whose LARC completes the norms across FSDP's shards: Largo's sgd,
// whose LARC uses the whole parameters' norms in every mode.
std::string optimizer_name_from(const std::string& name, const std::string& key, bool sharded) {
  const auto& names = optim::optimizer_names();
  require(
      name == "sgd_fsdp" || std::find(names.begin(), names.end(), name) != names.end(),
      key,
      name,
      fmt::format("one of {}, sgd_fsdp{}", fmt::join(names, ", "), sharded ? "" : " or zero"));
  return name == "sgd_fsdp" ? "sgd" : name;
}

// The optimizer ZeRO shards (OPTIMIZER.base_optimizer, the settings it leaves out from
// OPTIMIZER itself), or OPTIMIZER: its name, hyperparameters and LARC.
void optimizer_spec_from(
    const Config& config, bool shard_optimizer_state, TrainerOptions& options) {
  const bool zero_by_name = config.get_string("OPTIMIZER.name") == "zero";
  auto& optimizer = options.optimizer;
  auto& spec = optimizer.spec;
  auto optimizer_key = [&](const std::string& key) {
    const std::string nested = "OPTIMIZER.base_optimizer." + key;
    return shard_optimizer_state && config.has(nested) ? nested : "OPTIMIZER." + key;
  };
  const std::string name_key = optimizer_key("name");
  const std::string name = config.get_string(name_key);
  if (zero_by_name && name_key == "OPTIMIZER.name") {
    throw config_error(
        "OPTIMIZER.base_optimizer.name",
        "(missing)",
        "the optimizer ZeRO shards, e.g. sgd or adamw (OPTIMIZER.name is zero)");
  }
  spec.name = optimizer_name_from(name, name_key, shard_optimizer_state);
  refuse_keys_the_optimizer_ignores(config, optimizer_key, spec.name);
  spec.sgd.momentum = non_negative(config, optimizer_key("momentum"));
  spec.sgd.dampening = non_negative(config, optimizer_key("dampening"));
  spec.sgd.nesterov = config.get_bool(optimizer_key("nesterov"));
  optimizer.weight_decay = non_negative(config, optimizer_key("weight_decay"));
  const std::string betas_key = optimizer_key("betas");
  const std::vector<double> betas = config.get_double_list(betas_key);
  require(
      betas.size() == 2 && betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1,
      betas_key,
      "(given)",
      "two numbers in [0, 1)");
  spec.adam.betas = spec.adamw.betas = spec.lamb.betas = {betas[0], betas[1]};
  spec.adam.eps = spec.adamw.eps = spec.lamb.eps = non_negative(config, optimizer_key("eps"));
  spec.adam.amsgrad = spec.adamw.amsgrad = config.get_bool(optimizer_key("amsgrad"));
  spec.use_larc = config.get_bool(optimizer_key("use_larc"));
  spec.larc.clip = config.get_bool(optimizer_key("larc_config.clip"));
  spec.larc.eps = non_negative(config, optimizer_key("larc_config.eps"));
  const std::string trust_key = optimizer_key("larc_config.trust_coefficient");
  spec.larc.trust_coefficient = config.get_double(trust_key);
  require(
      spec.larc.trust_coefficient > 0,
      trust_key,
      fmt::format("{}", spec.larc.trust_coefficient),
      "a number > 0");
  optimizer.larc_exclude_bias_and_norm =
      config.get_bool(optimizer_key("larc_config.exclude_bias_and_norm"));
  if (spec.name == "lars") {
    lars_options_from(config, optimizer_key, optimizer);
  }
  if (spec.name == "rmsprop") {
    rmsprop_options_from(config, optimizer_key, spec.rmsprop);
  }
  (void)optim::make_optimizer({}, spec); // its own checks (optim/*.h), before anything runs
}

void grad_clip_options_from(const Config& config, TrainerOptions& options) {
  options.use_grad_clip = config.get_bool("MODEL.GRAD_CLIP.USE_GRAD_CLIP");
  options.grad_clip_max_norm = config.get_double("MODEL.GRAD_CLIP.MAX_NORM");
  options.grad_clip_norm_type = config.get_double("MODEL.GRAD_CLIP.NORM_TYPE");
  require(
      options.grad_clip_max_norm > 0,
      "MODEL.GRAD_CLIP.MAX_NORM",
      fmt::format("{}", options.grad_clip_max_norm),
      "a number > 0");
}

// The trainer loop, logging and evaluation.
void loop_options_from(const Config& config, TrainerOptions& options) {
  options.log_frequency = positive_int(config, "LOG_FREQUENCY");
  options.test_model = config.get_bool("TEST_MODEL");
  options.test_only = config.get_bool("TEST_ONLY");
  options.test_every_num_epoch = positive_int(config, "TEST_EVERY_NUM_EPOCH");
  options.topk_values = config.get_int_list("METERS.accuracy_list_meter.topk_values");
  require(
      !options.topk_values.empty(),
      "METERS.accuracy_list_meter.topk_values",
      "[]",
      "at least one k, e.g. [1, 5]");
  options.check_nan = config.get_bool("HOOKS.CHECK_NAN");
}

void machine_options_from(const Config& config, TrainerOptions& options) {
  options.device = config.get_string("MACHINE.DEVICE");
  require(
      options.device == "cpu" || options.device == "gpu",
      "MACHINE.DEVICE",
      options.device,
      "cpu or gpu");
  options.num_threads = config.get_int("MACHINE.NUM_THREADS");
  require(
      options.num_threads >= 0,
      "MACHINE.NUM_THREADS",
      std::to_string(options.num_threads),
      "an integer >= 0 (0 = every core)");
  require_count_within_machine(
      "MACHINE.NUM_THREADS",
      options.num_threads,
      available_cpu_cores(),
      "one per core; 0 = every core");
  const std::string attention = config.get_string("MACHINE.ATTENTION_BACKEND");
  const auto names = models::attention_backend_names();
  require(
      std::find(names.begin(), names.end(), attention) != names.end(),
      "MACHINE.ATTENTION_BACKEND",
      attention,
      fmt::format("one of: {}", fmt::join(names, ", ")));
  options.attention_backend = models::attention_backend_from_name(attention);
}

// Largo's switches that take auto or one of YAML's booleans (MODEL.CHANNELS_LAST,
// MACHINE.SYNC_EVERY_STEP).
TrainerOptions::AutoSwitch auto_switch_from(const Config& config, const std::string& key) {
  const YAML::Node value = config.node(key);
  if (value.IsScalar() && value.Scalar() == "auto") {
    return TrainerOptions::AutoSwitch::kAuto;
  }
  if (!value.IsScalar() || !yaml_scalar_is_bool(value)) {
    throw config_error(key, config.get_string(key), "auto, True or False");
  }
  return config.get_bool(key) ? TrainerOptions::AutoSwitch::kOn : TrainerOptions::AutoSwitch::kOff;
}

void checkpoint_options_from(const Config& config, TrainerOptions& options) {
  auto& checkpoint = options.checkpoint;
  checkpoint.dir = config.get_string("CHECKPOINT.DIR");
  require(!checkpoint.dir.empty(), "CHECKPOINT.DIR", "\"\"", "a directory path");
  checkpoint.auto_resume = config.get_bool("CHECKPOINT.AUTO_RESUME");
  checkpoint.frequency_epochs = positive_int(config, "CHECKPOINT.CHECKPOINT_FREQUENCY");
  checkpoint.frequency_iterations = config.get_int("CHECKPOINT.CHECKPOINT_ITER_FREQUENCY");
  require(
      checkpoint.frequency_iterations == -1 || checkpoint.frequency_iterations > 0,
      "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY",
      std::to_string(checkpoint.frequency_iterations),
      "-1 (off) or an integer > 0");
  checkpoint.overwrite_existing = config.get_bool("CHECKPOINT.OVERWRITE_EXISTING");
  options.use_tensorboard = config.get_bool("HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD");
  const int64_t clear_every = positive_int(config, "MODEL.CUDA_CACHE.CLEAR_FREQ");
  if (config.get_bool("MODEL.CUDA_CACHE.CLEAR_CUDA_CACHE")) {
    options.empty_device_cache_every = clear_every;
  }
}

TrainerOptions options_from_config(const Config& config) {
  refuse_unavailable_keys(config);
  TrainerOptions options;

  options.train = data_split_from(config, "DATA.TRAIN");
  options.test = data_split_from(config, "DATA.TEST");
  options.loading = data_loading_from(config);

  options.model = model_options_from(config);
  model_parallel_options_from(config, options);
  check_loss_name(config);
  options.self_supervised = self_supervised_options_from(config);
  options.model.moco = moco_model_options_from(config);
  options.model.dino = dino_model_options_from(config);
  if (!options.self_supervised.enabled()) {
    options.loss = classification_loss_options_from(config);
  }
  options.sync_batch_norm = sync_batch_norm_settings_from(config);
  options.model_ema = model_ema_settings_from(config);
  options.weights_init = weights_init_options_from(config, options.model);

  const bool shard_optimizer_state = zero_options_from(config, options);
  optimizer_spec_from(config, shard_optimizer_state, options);
  optimizer_schedule_from(config, options);
  grad_clip_options_from(config, options);
  loop_options_from(config, options);
  amp_options_from(config, options);
  fsdp_options_from(config, options);
  // Built here too, so that a bad AMP setting fails while the config is validated.
  precision::resolve_precision_policy(options.amp);
  rethrow_with_yaml_keys([&] { precision::GradScaler validated_scaler(options.grad_scaler); });
  options.seed = static_cast<uint64_t>(config.get_int("SEED_VALUE"));
  machine_options_from(config, options);
  options.channels_last = auto_switch_from(config, "MODEL.CHANNELS_LAST");
  options.sync_every_step = auto_switch_from(config, "MACHINE.SYNC_EVERY_STEP");
  options.cuda_graph = config.get_bool("MACHINE.CUDA_GRAPH");
  checkpoint_options_from(config, options);
  distributed_options_from(config, options);
  return options;
}

} // namespace

TrainerOptions trainer_options_from_config(const Config& config) {
  // The library's validators name their options; the config names YAML keys.
  return rethrow_with_yaml_keys([&] { return options_from_config(config); });
}

SyncBatchNormSettings sync_batch_norm_settings_from(const Config& config) {
  const std::string key = "MODEL.SYNC_BN_CONFIG.";
  SyncBatchNormSettings settings;
  settings.convert = config.get_bool(key + "CONVERT_BN_TO_SYNC_BN");
  const std::string type = config.get_string(key + "SYNC_BN_TYPE");
  require(
      type == "pytorch" || type == "apex",
      key + "SYNC_BN_TYPE",
      type,
      "pytorch or apex (both run Largo's SyncBatchNorm: the same statistics)");
  settings.group_size = config.get_int(key + "GROUP_SIZE");
  // -1 (one machine), 0 (all ranks) or N; checked here so that a bad value fails early.
  parallel::sync_bn_group_size(settings.group_size, 1, 1);
  return settings;
}

ModelEmaSettings model_ema_settings_from(const Config& config) {
  const std::string key = "HOOKS.EMA_MODEL.";
  ModelEmaSettings settings;
  settings.save = config.get_bool(key + "SAVE_EMA_MODEL");
  settings.meters = config.get_bool(key + "ENABLE_EMA_METERS");
  settings.average.update_iter = config.get_int(key + "UPDATE_ITER");
  settings.average.warmup = config.get_double(key + "WARMUP");
  settings.average.decay = config.get_double(key + "DECAY");
  const std::string device = config.get_string(key + "EMA_DEVICE");
  require(
      device == "gpu" || device == "cpu",
      key + "EMA_DEVICE",
      device,
      "gpu (beside the model) or cpu");
  if (device == "cpu") {
    settings.average.device = c10::Device(c10::kCPU);
  }
  optim::validate_model_ema_options(settings.average);
  return settings;
}

ClassificationLossOptions classification_loss_options_from(const Config& config) {
  const std::string name = config.get_string("LOSS.name");
  const std::string key = "LOSS." + name + ".";
  ClassificationLossOptions options;
  options.ignore_index = config.get_int(key + "ignore_index");
  if (name == "cross_entropy_multiple_output_single_target") {
    options.temperature = config.get_double(key + "temperature");
    require(
        options.temperature > 0,
        key + "temperature",
        fmt::format("{}", options.temperature),
        "a number > 0");
    options.normalize_output = config.get_bool(key + "normalize_output");
    if (!config.node(key + "weight").IsNull()) {
      options.weight = config.get_double_list(key + "weight");
    }
  }
  return options;
}

} // namespace largo::train
