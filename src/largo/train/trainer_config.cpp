#include <largo/train/trainer_config.h>

#include <largo/core/resources.h>
#include <largo/parallel/fully_sharded_data_parallel.h>
#include <largo/precision/model_cast.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

namespace largo::train {
namespace {

void require(bool ok, const std::string& key, const std::string& value, const std::string& expected) {
  if (!ok) {
    throw config_error(key, value, expected);
  }
}

int64_t positive_int(const Config& config, const std::string& key) {
  int64_t value = config.get_int(key);
  require(value > 0, key, std::to_string(value), "an integer > 0");
  return value;
}

// Process and thread counts beyond the machine are refused before anything starts them.
void require_count_within_machine(const std::string& key, int64_t value, int64_t limit,
                                  const std::string& rule) {
  if (value > limit) {
    throw ResourceError(fmt::format(
        "config key {} = {}: this machine gives the process {} cores, so at most {} ({})",
        key, value, available_cpu_cores(), limit, rule));
  }
}

double non_negative(const Config& config, const std::string& key) {
  double value = config.get_double(key);
  require(value >= 0.0, key, fmt::format("{}", value), "a number >= 0");
  return value;
}

// Switches for capabilities that have their own issues and are not built yet: a user
// who turns one on must hear that it is not there rather than train without it.
void reject_unimplemented(const Config& config) {
  struct Switch {
    const char* key;
    const char* feature;
  };
  const Switch switches[] = {
      {"MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN", "synchronized BatchNorm"},
      {"TEST_ONLY", "evaluation-only runs"},
  };
  for (const auto& entry : switches) {
    if (config.get_bool(entry.key)) {
      throw ConfigError(fmt::format(
          "config key {} = True: {} is not available in this version of Largo yet; set it to "
          "False",
          entry.key, entry.feature));
    }
  }
}

// OPTIMIZER.base_optimizer (ZeRO) holds a copy of OPTIMIZER's own keys, as VISSL writes it:
// anything else is a typo to report rather than a setting to drop silently.
void check_base_optimizer_keys(const Config& config) {
  const YAML::Node base = config.node("OPTIMIZER.base_optimizer");
  if (!base.IsMap()) {
    throw config_error("OPTIMIZER.base_optimizer", "(not a map)",
                       "a map of optimizer settings, e.g. {name: sgd, momentum: 0.9}");
  }
  for (const auto& item : base) {
    const std::string key = item.first.as<std::string>();
    if (key == "base_optimizer" || !config.has("OPTIMIZER." + key)) {
      throw config_error("OPTIMIZER.base_optimizer." + key, "(given)",
                         "a key of OPTIMIZER: name, momentum, nesterov, dampening, weight_decay, "
                         "betas, eps, amsgrad, use_larc or larc_config");
    }
    if (item.second.IsMap()) {
      for (const auto& nested : item.second) {
        const std::string nested_key = key + "." + nested.first.as<std::string>();
        if (!config.has("OPTIMIZER." + nested_key)) {
          throw config_error("OPTIMIZER.base_optimizer." + nested_key, "(given)",
                             "a key of OPTIMIZER." + key);
        }
      }
    }
  }
}

std::vector<data::TransformSpec> transforms_from(const Config& config, const std::string& key) {
  std::vector<data::TransformSpec> specs;
  YAML::Node list = config.node(key);
  if (!list.IsSequence()) {
    throw config_error(key, "(not a list)", "a list of {name: ..., ...} maps");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node entry = list[i];
    const std::string entry_key = fmt::format("{}[{}]", key, i);
    if (!entry.IsMap() || !entry["name"] || !entry["name"].IsScalar()) {
      throw config_error(entry_key, "(entry)", "a map with a 'name' key, e.g. {name: ToTensor}");
    }
    data::TransformSpec spec;
    spec.name = entry["name"].Scalar();
    for (const auto& argument : entry) {
      const std::string arg_name = argument.first.as<std::string>();
      if (arg_name == "name") {
        continue;
      }
      const std::string arg_key = fmt::format("{}.{}", entry_key, arg_name);
      std::vector<double> values;
      if (argument.second.IsSequence()) {
        for (const auto& element : argument.second) {
          values.push_back(yaml_to_double(element, arg_key));
        }
      } else {
        values.push_back(yaml_to_double(argument.second, arg_key));
      }
      spec.args[arg_name] = values;
    }
    specs.push_back(spec);
  }
  try { // the library's validator: names, arguments and their ranges
    data::make_pipeline(specs);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("config key {}: {}", key, e.what()));
  }
  return specs;
}

// Bounds before work: what a synthetic split asks for, against the machine's memory. A batch
// is held as uint8 and float32 by the loader and the model; the samplers order every index.
void check_synthetic_fits_machine(const DataSplitOptions& split, const std::string& prefix) {
  const auto& shape = split.synthetic_image_shape;
  const uint64_t batch_bytes = saturating_product(
      {static_cast<uint64_t>(split.batch_size), static_cast<uint64_t>(shape[0]),
       static_cast<uint64_t>(shape[1]), static_cast<uint64_t>(shape[2]), 1 + 4});
  require_memory(batch_bytes, fmt::format("a batch of {}.BATCHSIZE_PER_REPLICA = {} images of "
                                          "{}.SYNTHETIC.IMAGE_SHAPE = [{}]",
                                          prefix, split.batch_size, prefix, fmt::join(shape, ", ")));
  require_memory(saturating_product({static_cast<uint64_t>(split.synthetic_num_samples), 16}),
                 fmt::format("the samplers' index order over {}.SYNTHETIC.NUM_SAMPLES = {}", prefix,
                             split.synthetic_num_samples));
  // A batch's logits, their gradient and the softmax: one float per class and sample each.
  require_memory(saturating_product({static_cast<uint64_t>(split.batch_size),
                                     static_cast<uint64_t>(split.synthetic_num_classes), 4 * 3}),
                 fmt::format("the logits of a batch of {} for {}.SYNTHETIC.NUM_CLASSES = {}",
                             split.batch_size, prefix, split.synthetic_num_classes));
}

DataSplitOptions data_split_from(const Config& config, const std::string& prefix) {
  DataSplitOptions split;
  auto sources = config.get_string_list(prefix + ".DATA_SOURCES");
  require(sources.size() == 1, prefix + ".DATA_SOURCES", fmt::format("{} entries", sources.size()),
          "exactly one source: [torchvision_dataset] or [synthetic]");
  split.source = sources[0];
  require(split.source == "torchvision_dataset" || split.source == "synthetic",
          prefix + ".DATA_SOURCES", split.source, "torchvision_dataset or synthetic");
  if (split.source == "torchvision_dataset") {
    auto names = config.get_string_list(prefix + ".DATASET_NAMES");
    require(names.size() == 1, prefix + ".DATASET_NAMES", fmt::format("{} entries", names.size()),
            "one name: MNIST, FashionMNIST or CIFAR10");
    split.dataset_name = names[0];
    require(split.dataset_name == "MNIST" || split.dataset_name == "FashionMNIST" ||
                split.dataset_name == "CIFAR10",
            prefix + ".DATASET_NAMES", split.dataset_name, "MNIST, FashionMNIST or CIFAR10");
    auto paths = config.get_string_list(prefix + ".DATA_PATHS");
    require(paths.size() == 1, prefix + ".DATA_PATHS", fmt::format("{} entries", paths.size()),
            "one directory holding the dataset's files");
    split.path = paths[0];
  }
  split.batch_size = positive_int(config, prefix + ".BATCHSIZE_PER_REPLICA");
  split.drop_last = config.get_bool(prefix + ".DROP_LAST");
  split.use_stateful_sampler = config.get_bool(prefix + ".USE_STATEFUL_DISTRIBUTED_SAMPLER");
  split.data_limit = config.get_int(prefix + ".DATA_LIMIT");
  require(split.data_limit == -1 || split.data_limit > 0, prefix + ".DATA_LIMIT",
          std::to_string(split.data_limit), "-1 (all samples) or a count > 0");
  split.data_limit_seed = static_cast<uint64_t>(config.get_int(prefix + ".DATA_LIMIT_SAMPLING.SEED"));
  split.transforms = transforms_from(config, prefix + ".TRANSFORMS");
  split.synthetic_num_samples = positive_int(config, prefix + ".SYNTHETIC.NUM_SAMPLES");
  split.synthetic_image_shape = config.get_int_list(prefix + ".SYNTHETIC.IMAGE_SHAPE");
  const auto& shape = split.synthetic_image_shape;
  require(shape.size() == 3 && std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d > 0; }),
          prefix + ".SYNTHETIC.IMAGE_SHAPE", fmt::format("[{}]", fmt::join(shape, ", ")),
          "[channels, height, width], each > 0");
  split.synthetic_num_classes = positive_int(config, prefix + ".SYNTHETIC.NUM_CLASSES");
  if (split.source == "synthetic") {
    check_synthetic_fits_machine(split, prefix);
  }
  return split;
}

// The [C, H, W] of a split's samples, which the config alone says: the synthetic shape, or
// the fixed one of each supported dataset.
std::vector<int64_t> configured_sample_shape(const DataSplitOptions& split) {
  if (split.source == "synthetic") {
    return split.synthetic_image_shape;
  }
  if (split.dataset_name == "CIFAR10") {
    return std::vector<int64_t>{3, 32, 32};
  }
  return std::vector<int64_t>{1, 28, 28}; // MNIST, FashionMNIST
}

// MODEL.TRUNK.MLP.HIDDEN_DIMS: each > 0, and the parameters (float32) within the memory.
void check_mlp_fits_machine(const std::vector<int64_t>& hidden_dims, const DataSplitOptions& train) {
  const std::string key = "MODEL.TRUNK.MLP.HIDDEN_DIMS";
  const std::string text = fmt::format("[{}]", fmt::join(hidden_dims, ", "));
  require(std::all_of(hidden_dims.begin(), hidden_dims.end(), [](int64_t d) { return d > 0; }),
          key, text, "a list of layer widths, each > 0");
  const auto shape = configured_sample_shape(train);
  uint64_t inputs = saturating_product({static_cast<uint64_t>(shape[0]),
                                        static_cast<uint64_t>(shape[1]),
                                        static_cast<uint64_t>(shape[2])});
  uint64_t bytes = 0;
  for (int64_t width : hidden_dims) {
    const uint64_t layer = saturating_product({inputs + 1, static_cast<uint64_t>(width), 4});
    bytes = __builtin_add_overflow(bytes, layer, &bytes) ? UINT64_MAX : bytes;
    inputs = static_cast<uint64_t>(width);
  }
  require_memory(bytes, fmt::format("{} = {} (the MLP's float32 parameters alone)", key, text));
}

optim::AutoLrScaling auto_scaling_from(const Config& config, const std::string& prefix) {
  optim::AutoLrScaling scaling;
  scaling.auto_scale = config.get_bool(prefix + ".auto_scale");
  scaling.base_value = non_negative(config, prefix + ".base_value");
  scaling.base_lr_batch_size = positive_int(config, prefix + ".base_lr_batch_size");
  scaling.scaling_type = config.get_string(prefix + ".scaling_type");
  require(scaling.scaling_type == "linear" || scaling.scaling_type == "sqrt",
          prefix + ".scaling_type", scaling.scaling_type, "linear or sqrt");
  return scaling;
}

// A schedule node (param_schedulers.lr or one entry of its `schedulers` list). Missing
// keys keep the ScheduleOptions defaults, so composite entries can be short.
optim::ScheduleOptions schedule_from(const YAML::Node& node, const std::string& key,
                                     int64_t num_epochs) {
  optim::ScheduleOptions schedule;
  schedule.num_epochs = num_epochs;
  if (!node.IsMap()) {
    throw config_error(key, "(not a map)", "a schedule map with a 'name'");
  }
  auto child_key = [&](const char* name) { return key + "." + name; };
  // Sub-schedules of a composite are not in the defaults' tree, so the config layer cannot
  // check their keys: a misspelled start_value would be ignored without a word.
  static const std::vector<std::string> known = {
      "name", "update_interval", "value", "start_value", "end_value", "values", "milestones",
      "lengths", "interval_scaling", "schedulers", "auto_lr_scaling"};
  for (const auto& entry : node) {
    const std::string name = entry.first.as<std::string>();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string closest = known.front();
      for (const auto& candidate : known) {
        if (edit_distance(candidate, name) < edit_distance(closest, name)) {
          closest = candidate;
        }
      }
      throw ConfigError(fmt::format("unknown config key {}.{}; did you mean {}.{}?", key,
                                    abbreviate(name), key, closest));
    }
  }
  auto number_list = [&](const char* name) {
    std::vector<double> values;
    for (const auto& element : node[name]) {
      values.push_back(yaml_to_double(element, child_key(name)));
    }
    return values;
  };
  if (node["name"]) {
    schedule.name = node["name"].Scalar();
  }
  if (node["update_interval"]) {
    schedule.update_interval = node["update_interval"].Scalar();
    require(schedule.update_interval == "epoch" || schedule.update_interval == "step",
            child_key("update_interval"), schedule.update_interval, "epoch or step");
  }
  if (node["value"]) {
    schedule.value = yaml_to_double(node["value"], child_key("value"));
  }
  if (node["start_value"]) {
    schedule.start_value = yaml_to_double(node["start_value"], child_key("start_value"));
  }
  if (node["end_value"]) {
    schedule.end_value = yaml_to_double(node["end_value"], child_key("end_value"));
  }
  if (node["values"]) {
    schedule.values = number_list("values");
  }
  if (node["milestones"]) {
    schedule.milestones.clear();
    for (const auto& element : node["milestones"]) {
      schedule.milestones.push_back(yaml_to_int(element, child_key("milestones")));
    }
  }
  if (node["lengths"]) {
    schedule.lengths = number_list("lengths");
  }
  if (node["interval_scaling"]) {
    schedule.interval_scaling.clear();
    for (const auto& element : node["interval_scaling"]) {
      schedule.interval_scaling.push_back(element.Scalar());
    }
  }
  if (node["schedulers"]) {
    const YAML::Node list = node["schedulers"];
    for (size_t i = 0; i < list.size(); ++i) {
      schedule.schedulers.push_back(
          schedule_from(list[i], fmt::format("{}.schedulers[{}]", key, i), num_epochs));
    }
  }
  return schedule;
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
  grad_scaler.max_loss_scale = amp.amp_type == "apex"
      ? std::max(16777216.0, grad_scaler.init_scale)
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
      throw config_error(key, "(given)",
                         "one of the Apex options Largo implements: opt_level, "
                         "keep_batchnorm_fp32, master_weights, loss_scale, min_loss_scale, "
                         "max_loss_scale");
    }
  }
  options.tf32.matmul = config.get_bool("MACHINE.ALLOW_TF32_MATMUL");
  options.tf32.cudnn = config.get_bool("MACHINE.ALLOW_TF32_CUDNN");
}

} // namespace

// MODEL.FSDP_CONFIG (ZeRO stage 3, docs/fsdp.md). AUTO_SETUP_FSDP turns it on and, as VISSL
// does, derives the rest from MODEL.AMP_PARAMS: AMP on selects AMP_TYPE pytorch and
// mixed_precision, computing in float32 under autocast with FSDP's AMP_TYPE O1, or in
// compute copies of MODEL.AMP_PARAMS.DTYPE (float16 unless set) with O2; AMP off turns
// mixed_precision off and computes in float32 (FSDP's AMP_TYPE then changes nothing). An
// explicit compute_dtype float16 or bfloat16 with O1 asks for compute copies too (a Largo
// extension), and is the dtype the loss scaler then plans for; without AMP it is an error.
// The combinations this version cannot run are ConfigErrors raised when the trainer starts
// (trainer.cpp: check_fsdp_supported).
void fsdp_options_from(const Config& config, TrainerOptions& options) {
  const std::string prefix = "MODEL.FSDP_CONFIG.";
  auto& fsdp = options.fsdp;
  fsdp.enabled = config.get_bool(prefix + "AUTO_SETUP_FSDP");
  if (!fsdp.enabled) {
    return;
  }
  fsdp.auto_wrap_threshold = config.get_int(prefix + "AUTO_WRAP_THRESHOLD");
  require(fsdp.auto_wrap_threshold >= 0, prefix + "AUTO_WRAP_THRESHOLD",
          std::to_string(fsdp.auto_wrap_threshold),
          "an integer >= 0 (0 wraps every trunk block that has parameters)");
  const std::string amp_type = config.get_string(prefix + "AMP_TYPE");
  require(amp_type == "01" || amp_type == "O1" || amp_type == "O2", prefix + "AMP_TYPE", amp_type,
          "O1 (float32 compute; VISSL's default \"01\" reads the same) or O2 (compute copies in "
          "MODEL.AMP_PARAMS.DTYPE)");
  fsdp.compute_dtype = config.get_string(prefix + "compute_dtype");
  require(fsdp.compute_dtype == "float32" || fsdp.compute_dtype == "float16" ||
              fsdp.compute_dtype == "bfloat16",
          prefix + "compute_dtype", fsdp.compute_dtype, "float32, float16 or bfloat16");
  fsdp.reshard_after_forward = config.get_bool(prefix + "reshard_after_forward");
  fsdp.prefetch = config.get_bool(prefix + "prefetch");
  fsdp.mixed_precision = options.amp.use_amp;
  fsdp.fp32_reduce_scatter = config.get_bool(prefix + "fp32_reduce_scatter");
  if (options.amp.use_amp) {
    options.amp.amp_type = "pytorch"; // VISSL forces it for FSDP; apex's O2/O3 casts do not apply
    if (amp_type == "O2") {
      fsdp.compute_dtype = options.amp.dtype; // VISSL: O2 computes with float16 copies
    } else if (fsdp.compute_dtype != "float32") {
      options.amp.dtype = fsdp.compute_dtype;
    }
  }
  // flatten_parameters: units are always flat here (with LARC too: its per-parameter norms
  // are completed across ranks). bucket_cap_mb: each unit is reduce-scattered on its own.
  // clear_autocast_cache: autocast's cache is dropped when each forward's autocast region
  // ends. verbose: the units are always logged. Read so that a wrong type is reported.
  config.get_bool(prefix + "flatten_parameters");
  require(config.get_int(prefix + "bucket_cap_mb") >= 0, prefix + "bucket_cap_mb", "(given)",
          "an integer >= 0");
  config.get_bool(prefix + "clear_autocast_cache");
  config.get_bool(prefix + "verbose");
}

TrainerOptions trainer_options_from_config(const Config& config) {
  reject_unimplemented(config);
  TrainerOptions options;

  options.train = data_split_from(config, "DATA.TRAIN");
  options.test = data_split_from(config, "DATA.TEST");
  options.num_dataloader_workers = config.get_int("DATA.NUM_DATALOADER_WORKERS");
  require(options.num_dataloader_workers >= 0, "DATA.NUM_DATALOADER_WORKERS",
          std::to_string(options.num_dataloader_workers), "an integer >= 0");
  // Loader workers are threads that mostly wait on reads: a few per core help, thousands
  // exhaust the process's threads.
  require_count_within_machine("DATA.NUM_DATALOADER_WORKERS", options.num_dataloader_workers,
                               4 * available_cpu_cores(), "4 per core");

  // Model. in_channels / image_size / num_classes come from the data (0 = infer).
  auto& model = options.model;
  model.in_channels = 0;
  model.image_size = 0;
  model.num_classes = 0;
  model.trunk_name = config.get_string("MODEL.TRUNK.NAME");
  const auto& trunks = models::supported_trunk_names();
  require(std::find(trunks.begin(), trunks.end(), model.trunk_name) != trunks.end(),
          "MODEL.TRUNK.NAME", model.trunk_name, fmt::format("one of: {}", fmt::join(trunks, ", ")));
  model.resnet.depth = config.get_int("MODEL.TRUNK.RESNETS.DEPTH");
  model.resnet.stem = config.get_string("MODEL.TRUNK.RESNETS.STEM");
  model.resnet.zero_init_residual = config.get_bool("MODEL.TRUNK.RESNETS.ZERO_INIT_RESIDUAL");
  model.resnet.width_multiplier = positive_int(config, "MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER");
  const std::string vit = "MODEL.TRUNK.VISION_TRANSFORMERS.";
  // The ViT's image size is the data's (IMAGE_SIZE is VISSL's ImageNet default, 224).
  model.vit.patch_size = positive_int(config, vit + "PATCH_SIZE");
  model.vit.num_layers = positive_int(config, vit + "NUM_LAYERS");
  model.vit.num_heads = positive_int(config, vit + "NUM_HEADS");
  model.vit.hidden_dim = positive_int(config, vit + "HIDDEN_DIM");
  model.vit.mlp_dim = positive_int(config, vit + "MLP_DIM");
  model.vit.dropout = non_negative(config, vit + "DROPOUT_RATE");
  model.vit.attention_dropout = non_negative(config, vit + "ATTENTION_DROPOUT_RATE");
  model.vit.qkv_bias = config.get_bool(vit + "QKV_BIAS");
  model.vit.classifier = config.get_string(vit + "CLASSIFIER");
  model.mlp.hidden_dims = config.get_int_list("MODEL.TRUNK.MLP.HIDDEN_DIMS");
  if (model.trunk_name == "mlp") {
    check_mlp_fits_machine(model.mlp.hidden_dims, options.train);
  }
  model.small_cnn.dropout = non_negative(config, "MODEL.TRUNK.SMALL_CNN.DROPOUT");
  YAML::Node heads = config.node("MODEL.HEAD.PARAMS");
  if (heads.IsSequence() && heads.size() > 0) {
    // VISSL's [["mlp", {"dims": [in, ..., out]}]]: one head of kind mlp.
    const YAML::Node head = heads[0];
    bool well_formed = heads.size() == 1 && head.IsSequence() && head.size() == 2 &&
        head[0].IsScalar() && head[0].Scalar() == "mlp" && head[1].IsMap() && head[1]["dims"];
    require(well_formed, "MODEL.HEAD.PARAMS", "(given)",
            "one head written as [[\"mlp\", {\"dims\": [in, ..., num_classes]}]]");
    const YAML::Node kwargs = head[1];
    for (const auto& dim : kwargs["dims"]) {
      model.head_dims.push_back(yaml_to_int(dim, "MODEL.HEAD.PARAMS.dims"));
    }
    auto flag = [&](const char* name, bool& target) {
      if (kwargs[name]) {
        target = yaml_to_bool(kwargs[name], fmt::format("MODEL.HEAD.PARAMS.{}", name));
      }
    };
    flag("use_bn", model.head.use_bn);
    flag("use_relu", model.head.use_relu);
    flag("use_dropout", model.head.use_dropout);
    flag("use_bias", model.head.use_bias);
    flag("skip_last_layer_relu_bn", model.head.skip_last_layer_relu_bn);
  }
  model.head.batchnorm_eps = config.get_double("MODEL.HEAD.BATCHNORM_EPS");
  model.head.batchnorm_momentum = config.get_double("MODEL.HEAD.BATCHNORM_MOMENTUM");
  const std::string checkpointing = "MODEL.ACTIVATION_CHECKPOINTING.";
  options.activation_checkpointing.enabled =
      config.get_bool(checkpointing + "USE_ACTIVATION_CHECKPOINTING");
  options.activation_checkpointing.num_splits =
      positive_int(config, checkpointing + "NUM_ACTIVATION_CHECKPOINTING_SPLITS");

  // Loss.
  const std::string loss = config.get_string("LOSS.name");
  require(loss == "CrossEntropyLoss" || loss == "cross_entropy_multiple_output_single_target",
          "LOSS.name", loss, "CrossEntropyLoss or cross_entropy_multiple_output_single_target");
  options.loss_ignore_index = config.get_int(fmt::format("LOSS.{}.ignore_index", loss));

  // Optimizer. ZeRO (OPTIMIZER.name: zero, as the VISSL docs write it, or use_zero: True)
  // shards the state of the optimizer that OPTIMIZER.base_optimizer describes; the settings
  // it leaves out come from OPTIMIZER itself.
  auto& optimizer = options.optimizer;
  auto& spec = optimizer.spec;
  const bool zero_by_name = config.get_string("OPTIMIZER.name") == "zero";
  auto& zero = options.zero;
  zero.shard_gradients = config.get_bool("MODEL.SHARDED_DDP_SETUP.USE_SDP");
  zero.shard_optimizer_state =
      zero_by_name || config.get_bool("OPTIMIZER.use_zero") || zero.shard_gradients;
  const int64_t reduce_buffer_size = config.get_int("MODEL.SHARDED_DDP_SETUP.reduce_buffer_size");
  require(reduce_buffer_size == -1 || reduce_buffer_size > 0,
          "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size", std::to_string(reduce_buffer_size),
          "-1 (FairScale's default, 2^23 elements) or a number of elements > 0");
  if (reduce_buffer_size > 0) {
    zero.reduce_buffer_elements = reduce_buffer_size;
  }
  if (zero.shard_optimizer_state) {
    check_base_optimizer_keys(config);
  }
  auto optimizer_key = [&](const std::string& key) {
    const std::string nested = "OPTIMIZER.base_optimizer." + key;
    return zero.shard_optimizer_state && config.has(nested) ? nested : "OPTIMIZER." + key;
  };
  const std::string name_key = optimizer_key("name");
  spec.name = config.get_string(name_key);
  if (zero_by_name && name_key == "OPTIMIZER.name") {
    throw config_error("OPTIMIZER.base_optimizer.name", "(missing)",
                       "the optimizer ZeRO shards: sgd, adamw or lamb (OPTIMIZER.name is zero)");
  }
  require(spec.name == "sgd" || spec.name == "adamw" || spec.name == "lamb", name_key, spec.name,
          zero.shard_optimizer_state ? "sgd, adamw or lamb" : "sgd, adamw, lamb or zero");
  spec.sgd.momentum = non_negative(config, optimizer_key("momentum"));
  spec.sgd.dampening = non_negative(config, optimizer_key("dampening"));
  spec.sgd.nesterov = config.get_bool(optimizer_key("nesterov"));
  optimizer.weight_decay = non_negative(config, optimizer_key("weight_decay"));
  const std::string betas_key = optimizer_key("betas");
  const std::vector<double> betas = config.get_double_list(betas_key);
  require(betas.size() == 2 && betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1,
          betas_key, "(given)", "two numbers in [0, 1)");
  spec.adamw.betas = spec.lamb.betas = {betas[0], betas[1]};
  spec.adamw.eps = spec.lamb.eps = non_negative(config, optimizer_key("eps"));
  spec.adamw.amsgrad = config.get_bool(optimizer_key("amsgrad"));
  spec.use_larc = config.get_bool(optimizer_key("use_larc"));
  spec.larc.clip = config.get_bool(optimizer_key("larc_config.clip"));
  spec.larc.eps = non_negative(config, optimizer_key("larc_config.eps"));
  const std::string trust_key = optimizer_key("larc_config.trust_coefficient");
  spec.larc.trust_coefficient = config.get_double(trust_key);
  require(spec.larc.trust_coefficient > 0, trust_key,
          fmt::format("{}", spec.larc.trust_coefficient), "a number > 0");
  optimizer.larc_exclude_bias_and_norm =
      config.get_bool(optimizer_key("larc_config.exclude_bias_and_norm"));
  optimizer.num_epochs = positive_int(config, "OPTIMIZER.num_epochs");
  auto& groups = optimizer.param_groups;
  groups.weight_decay = optimizer.weight_decay;
  groups.regularize_bn = config.get_bool("OPTIMIZER.regularize_bn");
  groups.regularize_bias = config.get_bool("OPTIMIZER.regularize_bias");
  groups.non_regularized_parameters = config.get_string_list("OPTIMIZER.non_regularized_parameters");
  groups.use_different_wd = config.get_bool("OPTIMIZER.head_optimizer_params.use_different_wd");
  groups.head_weight_decay = non_negative(config, "OPTIMIZER.head_optimizer_params.weight_decay");
  const std::string schedulers = "OPTIMIZER.param_schedulers.";
  optimizer.lr = schedule_from(config.node(schedulers + "lr"), schedulers + "lr", optimizer.num_epochs);
  optimizer.lr_scaling = auto_scaling_from(config, schedulers + "lr.auto_lr_scaling");
  optimizer.head_use_different_lr =
      config.get_bool("OPTIMIZER.head_optimizer_params.use_different_lr");
  optimizer.lr_head =
      schedule_from(config.node(schedulers + "lr_head"), schedulers + "lr_head", optimizer.num_epochs);
  optimizer.lr_head_scaling = auto_scaling_from(config, schedulers + "lr_head.auto_lr_scaling");
  optim::make_schedule(optimizer.lr, schedulers + "lr"); // the library's validator
  if (optimizer.head_use_different_lr) { // otherwise the trainer uses lr for the head too
    optim::make_schedule(optimizer.lr_head, schedulers + "lr_head");
  }

  options.use_grad_clip = config.get_bool("MODEL.GRAD_CLIP.USE_GRAD_CLIP");
  options.grad_clip_max_norm = config.get_double("MODEL.GRAD_CLIP.MAX_NORM");
  options.grad_clip_norm_type = config.get_double("MODEL.GRAD_CLIP.NORM_TYPE");
  require(options.grad_clip_max_norm > 0, "MODEL.GRAD_CLIP.MAX_NORM",
          fmt::format("{}", options.grad_clip_max_norm), "a number > 0");

  // Trainer loop, logging and evaluation.
  options.log_frequency = positive_int(config, "LOG_FREQUENCY");
  options.test_model = config.get_bool("TEST_MODEL");
  options.test_only = config.get_bool("TEST_ONLY");
  options.test_every_num_epoch = positive_int(config, "TEST_EVERY_NUM_EPOCH");
  options.topk_values = config.get_int_list("METERS.accuracy_list_meter.topk_values");
  require(!options.topk_values.empty(), "METERS.accuracy_list_meter.topk_values", "[]",
          "at least one k, e.g. [1, 5]");
  options.check_nan = config.get_bool("HOOKS.CHECK_NAN");
  amp_options_from(config, options);
  fsdp_options_from(config, options);
  // Built here too, so that a bad AMP setting fails while the config is validated.
  precision::resolve_precision_policy(options.amp);
  precision::GradScaler validated_scaler(options.grad_scaler);
  options.seed = static_cast<uint64_t>(config.get_int("SEED_VALUE"));

  options.device = config.get_string("MACHINE.DEVICE");
  require(options.device == "cpu" || options.device == "gpu", "MACHINE.DEVICE", options.device,
          "cpu or gpu");
  options.num_threads = config.get_int("MACHINE.NUM_THREADS");
  require(options.num_threads >= 0, "MACHINE.NUM_THREADS", std::to_string(options.num_threads),
          "an integer >= 0 (0 = every core)");
  require_count_within_machine("MACHINE.NUM_THREADS", options.num_threads, available_cpu_cores(),
                               "one per core; 0 = every core");

  auto& checkpoint = options.checkpoint;
  checkpoint.dir = config.get_string("CHECKPOINT.DIR");
  require(!checkpoint.dir.empty(), "CHECKPOINT.DIR", "\"\"", "a directory path");
  checkpoint.auto_resume = config.get_bool("CHECKPOINT.AUTO_RESUME");
  checkpoint.frequency_epochs = positive_int(config, "CHECKPOINT.CHECKPOINT_FREQUENCY");
  checkpoint.frequency_iterations = config.get_int("CHECKPOINT.CHECKPOINT_ITER_FREQUENCY");
  require(checkpoint.frequency_iterations == -1 || checkpoint.frequency_iterations > 0,
          "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY", std::to_string(checkpoint.frequency_iterations),
          "-1 (off) or an integer > 0");
  checkpoint.overwrite_existing = config.get_bool("CHECKPOINT.OVERWRITE_EXISTING");
  options.use_tensorboard = config.get_bool("HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD");

  // Data parallelism. NUM_NODES / NUM_PROC_PER_NODE / INIT_METHOD / RUN_ID decide how the
  // workers start (train/worker_launch.h); a worker learns its rank from the environment.
  auto& distributed = options.distributed;
  distributed.backend = config.get_string("DISTRIBUTED.BACKEND");
  require(distributed.backend == "gloo" || distributed.backend == "nccl", "DISTRIBUTED.BACKEND",
          distributed.backend, "gloo (CPU) or nccl (CUDA)");
  distributed.broadcast_buffers = config.get_bool("DISTRIBUTED.BROADCAST_BUFFERS");
  distributed.manual_gradient_reduction = config.get_bool("DISTRIBUTED.MANUAL_GRADIENT_REDUCTION");
  distributed.find_unused_parameters = config.get_bool("DISTRIBUTED.FIND_UNUSED_PARAMETERS");
  distributed.delay_allreduce = config.get_bool("DISTRIBUTED.DELAY_ALLREDUCE");
  distributed.bucket_cap_mb = positive_int(config, "DATA.DDP_BUCKET_CAP_MB");
  distributed.rendezvous_timeout_seconds =
      positive_int(config, "DISTRIBUTED.RENDEZVOUS_TIMEOUT_SECONDS");
  distributed.collective_timeout_seconds =
      positive_int(config, "DISTRIBUTED.COLLECTIVE_TIMEOUT_SECONDS");
  positive_int(config, "DISTRIBUTED.NUM_NODES");
  positive_int(config, "DISTRIBUTED.NUM_PROC_PER_NODE");
  options.gradient_accumulation_steps = positive_int(config, "TRAINER.GRADIENT_ACCUMULATION_STEPS");
  return options;
}

parallel::FullyShardedDataParallelOptions fully_sharded_options(const TrainerOptions& options) {
  parallel::FullyShardedDataParallelOptions fsdp;
  fsdp.auto_wrap_threshold = options.fsdp.auto_wrap_threshold;
  fsdp.reshard_after_forward = options.fsdp.reshard_after_forward;
  fsdp.prefetch = options.fsdp.prefetch;
  fsdp.broadcast_buffers = options.distributed.broadcast_buffers;
  fsdp.compute_dtype = options.fsdp.compute_copies();
  fsdp.fp32_reduce_scatter = options.fsdp.fp32_reduce_scatter;
  fsdp.keeps_fp32 = [](const torch::nn::Module& module) {
    return precision::is_batchnorm(module); // Apex's keep_batchnorm_fp32
  };
  return fsdp;
}

} // namespace largo::train
