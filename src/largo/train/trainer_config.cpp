#include <largo/train/trainer_config.h>

#include "config_checks.h"
#include "optimizer_schedule_config.h"
#include "regnet_config.h"
#include "self_supervised_config.h"
#include "vissl_fsdp_names.h"

#include <largo/core/config_value.h>
#include <largo/core/resources.h>
#include <largo/models/feature_taps.h>
#include <largo/models/resnet.h>
#include <largo/models/vissl_names.h>
#include <largo/parallel/data_parallel/fully_sharded_data_parallel.h>
#include <largo/parallel/data_parallel/sync_batch_norm.h>
#include <largo/precision/model_cast.h>
#include <largo/train/data_config.h>
#include <largo/train/option_keys.h>
#include <largo/train/unavailable_keys.h>
#include <largo/train/worker_launch.h>

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

// MODEL.TRUNK.RESNETS (the ResNet validates the values it gets: models/resnet.h).
void resnet_options_from(const Config& config, models::ResNetOptions& resnet) {
  const std::string key = "MODEL.TRUNK.RESNETS.";
  resnet.depth = config.get_int(key + "DEPTH");
  resnet.stem = config.get_string(key + "STEM");
  resnet.zero_init_residual = config.get_bool(key + "ZERO_INIT_RESIDUAL");
  resnet.width_multiplier = positive_int(config, key + "WIDTH_MULTIPLIER");
  resnet.groups = config.get_int(key + "GROUPS");
  resnet.width_per_group = config.get_int(key + "WIDTH_PER_GROUP");
  resnet.layer4_stride = config.get_int(key + "LAYER4_STRIDE");
  resnet.norm.type = config.get_string(key + "NORM");
  resnet.norm.groupnorm_groups = config.get_int(key + "GROUPNORM_GROUPS");
  models::validate_norm_options(resnet.norm);
}

// MODEL.TRUNK.VISION_TRANSFORMERS. The ViT is sized from the data's images; IMAGE_SIZE other
// than VISSL's default (224) must equal them (models::VitOptions::image_size).
void vit_options_from(const Config& config, models::VitOptions& vit) {
  const std::string key = "MODEL.TRUNK.VISION_TRANSFORMERS.";
  const int64_t image_size = positive_int(config, key + "IMAGE_SIZE");
  vit.image_size = image_size == 224 ? 0 : image_size;
  vit.patch_size = positive_int(config, key + "PATCH_SIZE");
  vit.num_layers = positive_int(config, key + "NUM_LAYERS");
  vit.num_heads = positive_int(config, key + "NUM_HEADS");
  vit.hidden_dim = positive_int(config, key + "HIDDEN_DIM");
  vit.mlp_dim = positive_int(config, key + "MLP_DIM");
  vit.dropout = non_negative(config, key + "DROPOUT_RATE");
  vit.attention_dropout = non_negative(config, key + "ATTENTION_DROPOUT_RATE");
  vit.drop_path_rate = non_negative(config, key + "DROP_PATH_RATE");
  vit.qkv_bias = config.get_bool(key + "QKV_BIAS");
  vit.classifier = config.get_string(key + "CLASSIFIER");
  // VISSL reads USE_CLASS_TOKEN (with default True) and ignores CLASSIFIER; Largo also
  // reads CLASSIFIER: either one can drop the class token (models::has_class_token).
  vit.use_class_token = config.get_bool(key + "USE_CLASS_TOKEN");
}

// MODEL.HEAD.PARAMS: VISSL's [[name, {kwargs}], ...], one entry per head (mlp or eval_mlp).
// `defaults` carries MODEL.HEAD.BATCHNORM_EPS / MOMENTUM.
std::vector<models::EvalHeadOptions>
heads_from(const Config& config, const models::MlpHeadOptions& defaults) {
  const std::string key = "MODEL.HEAD.PARAMS";
  const YAML::Node list = config.node(key);
  require(list.IsSequence(), key, "(not a list)", "a list of [name, {kwargs}] heads");
  std::vector<models::EvalHeadOptions> heads;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node head = list[i];
    const std::string head_key = fmt::format("{}[{}]", key, i);
    const bool well_formed = head.IsSequence() && head.size() == 2 && head[0].IsScalar() &&
                             head[1].IsMap() && head[1]["dims"] && head[1]["dims"].IsSequence();
    require(
        well_formed,
        head_key,
        "(given)",
        "a head written as [\"mlp\", {\"dims\": [in, ..., num_classes]}] or [\"eval_mlp\", "
        "{\"in_channels\": C, \"dims\": [in, ..., num_classes]}]");
    models::EvalHeadOptions options;
    options.name = head_architecture(config, head[0].Scalar(), head_key); // mlp_fsdp: mlp
    require(
        options.name == "mlp" || options.name == "eval_mlp",
        head_key,
        options.name,
        "mlp or eval_mlp");
    options.mlp = defaults;
    const YAML::Node kwargs = head[1];
    for (const auto& entry : kwargs) {
      const std::string name = entry.first.as<std::string>();
      const std::string arg_key = head_key + "." + name;
      const YAML::Node& value = entry.second;
      if (name == "dims") {
        for (const auto& dim : value) {
          options.dims.push_back(yaml_to_int(dim, arg_key));
        }
      } else if (name == "in_channels" && options.name == "eval_mlp") {
        options.in_channels = yaml_to_int(value, arg_key);
      } else if (name == "use_bn") {
        options.mlp.use_bn = yaml_to_bool(value, arg_key);
      } else if (name == "use_relu") {
        options.mlp.use_relu = yaml_to_bool(value, arg_key);
      } else if (name == "use_dropout" && options.name == "mlp") {
        options.mlp.use_dropout = yaml_to_bool(value, arg_key);
      } else if (name == "use_bias" && options.name == "mlp") {
        options.mlp.use_bias = yaml_to_bool(value, arg_key);
      } else if (name == "skip_last_layer_relu_bn" && options.name == "mlp") {
        options.mlp.skip_last_layer_relu_bn = yaml_to_bool(value, arg_key);
      } else {
        throw config_error(
            arg_key,
            "(given)",
            options.name == "mlp"
                ? "an mlp argument: dims, use_bn, use_relu, use_dropout, use_bias, "
                  "skip_last_layer_relu_bn"
                : "an eval_mlp argument: in_channels, dims, use_bn, use_relu");
      }
    }
    heads.push_back(options);
  }
  return heads;
}

// One entry of LINEAR_EVAL_FEAT_POOL_OPS_MAP: [feature, [op, [args]]], the args those of
// torch.nn's pooling modules: (Avg|Max)Pool2d [kernel_size, stride, padding],
// Adaptive(Avg|Max)Pool2d [output_size], Identity [].
models::FeatureTap feature_tap_from(const YAML::Node& entry, const std::string& key) {
  const bool well_formed = entry.IsSequence() && entry.size() == 2 && entry[0].IsScalar() &&
                           entry[1].IsSequence() && entry[1].size() >= 1 &&
                           entry[1][0].IsScalar() &&
                           (entry[1].size() == 1 || entry[1][1].IsSequence());
  require(
      well_formed,
      key,
      "(given)",
      "[feature, [pool op, [args]]], e.g. [\"res5\", [\"AvgPool2d\", [[6, 6], 1, 0]]]");
  models::FeatureTap tap;
  tap.feature = entry[0].Scalar();
  tap.pool = entry[1][0].Scalar();
  const YAML::Node args = entry[1].size() > 1 ? entry[1][1] : YAML::Node(YAML::NodeType::Sequence);
  auto int_or_pair = [&](const YAML::Node& value) {
    std::vector<int64_t> sizes;
    if (value.IsSequence()) {
      for (const auto& v : value) {
        sizes.push_back(yaml_to_int(v, key));
      }
    } else {
      sizes.push_back(yaml_to_int(value, key));
    }
    return sizes;
  };
  if (args.size() > 0) {
    tap.kernel_size = int_or_pair(args[0]);
  }
  if (args.size() > 1) {
    tap.stride = yaml_to_int(args[1], key);
  }
  if (args.size() > 2) {
    tap.padding = yaml_to_int(args[2], key);
  }
  require(
      args.size() <= 3,
      key,
      fmt::format("{} arguments", args.size()),
      "at most [kernel_size, stride, padding]");
  return tap;
}

models::FeatureEvalOptions feature_eval_options_from(const Config& config) {
  const std::string key = "MODEL.FEATURE_EVAL_SETTINGS.";
  models::FeatureEvalOptions options;
  options.eval_mode_on = config.get_bool(key + "EVAL_MODE_ON");
  options.freeze_trunk_only = config.get_bool(key + "FREEZE_TRUNK_ONLY");
  options.freeze_trunk_and_head = config.get_bool(key + "FREEZE_TRUNK_AND_HEAD");
  options.extract_trunk_features_only = config.get_bool(key + "EXTRACT_TRUNK_FEATURES_ONLY");
  options.eval_trunk_and_head = config.get_bool(key + "EVAL_TRUNK_AND_HEAD");
  options.assert_head_layer_shape_init = config.get_bool(key + "ASSERT_HEAD_LAYER_SHAPE_INIT");
  options.should_flatten_feats = config.get_bool(key + "SHOULD_FLATTEN_FEATS");
  const std::string map_key = key + "LINEAR_EVAL_FEAT_POOL_OPS_MAP";
  const YAML::Node map = config.node(map_key);
  require(map.IsSequence(), map_key, "(not a list)", "a list of [feature, [pool op, [args]]]");
  for (size_t i = 0; i < map.size(); ++i) {
    options.taps.push_back(feature_tap_from(map[i], fmt::format("{}[{}]", map_key, i)));
  }
  return options;
}
} // namespace

namespace {

// MODEL.FSDP_CONFIG's precision keys. As VISSL does, they follow MODEL.AMP_PARAMS: AMP on
// selects AMP_TYPE pytorch and mixed_precision, computing in float32 under autocast with
// FSDP's AMP_TYPE O1, or in compute copies of MODEL.AMP_PARAMS.DTYPE (float16 unless set) with
// O2; AMP off turns mixed_precision off and computes in float32 (FSDP's AMP_TYPE then changes
// nothing). An explicit compute_dtype float16 or bfloat16 with O1 asks for compute copies too
// (a Largo extension), and is the dtype the loss scaler then plans for; without AMP it is an
// error.
void fsdp_precision_from(const Config& config, TrainerOptions& options) {
  const std::string prefix = "MODEL.FSDP_CONFIG.";
  const std::string amp_type = config.get_string(prefix + "AMP_TYPE");
  require(
      amp_type == "01" || amp_type == "O1" || amp_type == "O2",
      prefix + "AMP_TYPE",
      amp_type,
      "O1 (float32 compute; VISSL's default \"01\" reads the same) or O2 (compute copies in "
      "MODEL.AMP_PARAMS.DTYPE)");
  std::string compute_dtype = config.get_string(prefix + "compute_dtype");
  require(
      compute_dtype == "float32" || compute_dtype == "float16" || compute_dtype == "bfloat16",
      prefix + "compute_dtype",
      compute_dtype,
      "float32, float16 or bfloat16");
  auto& fsdp = options.parallel.fsdp;
  fsdp.fp32_reduce_scatter = config.get_bool(prefix + "fp32_reduce_scatter");
  const bool mixed_precision = options.amp.use_amp; // VISSL's FSDP_CONFIG.mixed_precision
  if (fsdp.fp32_reduce_scatter && !mixed_precision) {
    throw ConfigError(
        "MODEL.FSDP_CONFIG.fp32_reduce_scatter needs mixed_precision (AUTO_SETUP_FSDP turns "
        "mixed_precision on with MODEL.AMP_PARAMS.USE_AMP): turn AMP on, or set "
        "fp32_reduce_scatter to False");
  }
  if (compute_dtype != "float32" && !mixed_precision) {
    throw ConfigError(fmt::format(
        "MODEL.FSDP_CONFIG.compute_dtype {} needs mixed_precision (AUTO_SETUP_FSDP turns it on "
        "with MODEL.AMP_PARAMS.USE_AMP): turn AMP on, or set compute_dtype float32",
        compute_dtype));
  }
  if (!mixed_precision) {
    return;
  }
  options.amp.amp_type = "pytorch"; // VISSL forces it for FSDP; apex's O2/O3 casts do not apply
  if (amp_type == "O2") {
    compute_dtype = options.amp.dtype; // VISSL: O2 computes with float16 copies
  } else if (compute_dtype != "float32") {
    options.amp.dtype = compute_dtype;
  }
  if (compute_dtype != "float32") { // else float32 units, the forward under autocast
    fsdp.compute_dtype = compute_dtype == "bfloat16" ? at::kBFloat16 : at::kHalf;
  }
}

} // namespace

// MODEL.FSDP_CONFIG (ZeRO stage 3, docs/fsdp.md): AUTO_SETUP_FSDP turns it on, after the
// ZeRO keys were read (the two exclude each other).
void fsdp_options_from(const Config& config, TrainerOptions& options) {
  const std::string prefix = "MODEL.FSDP_CONFIG.";
  const bool offload = config.get_bool(prefix + "offload_optimizer");
  if (!config.get_bool(prefix + "AUTO_SETUP_FSDP")) {
    require(
        !offload,
        prefix + "offload_optimizer",
        "True",
        "False without FSDP (MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP); ZeRO-1/2's is "
        "OPTIMIZER.offload_optimizer");
    return;
  }
  const bool zero_on = options.parallel.data_parallelism != parallel::DataParallelism::kDdp;
  options.parallel.data_parallelism = parallel::DataParallelism::kFsdp;
  auto& fsdp = options.parallel.fsdp;
  const int64_t auto_wrap_threshold = config.get_int(prefix + "AUTO_WRAP_THRESHOLD");
  require(
      auto_wrap_threshold >= 0,
      prefix + "AUTO_WRAP_THRESHOLD",
      std::to_string(auto_wrap_threshold),
      "an integer >= 0 (0 wraps every trunk block that has parameters)");
  fsdp.wrap_policy = trunk_block_units(auto_wrap_threshold);
  fsdp.reshard_after_forward = config.get_bool(prefix + "reshard_after_forward");
  fsdp.prefetch = config.get_bool(prefix + "prefetch");
  options.parallel.offload_optimizer = offload;
  fsdp_precision_from(config, options);
  if (zero_on) {
    throw ConfigError(
        "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP (ZeRO stage 3) and ZeRO stage 1/2 (OPTIMIZER.use_zero, "
        "OPTIMIZER.name zero or MODEL.SHARDED_DDP_SETUP.USE_SDP) are both on; stage 3 already "
        "shards the optimizer state and the gradients: turn the other off");
  }
  // flatten_parameters: units are always flat here (with LARC too: its per-parameter norms
  // are completed across ranks). bucket_cap_mb: each unit is reduce-scattered on its own.
  // clear_autocast_cache: autocast's cache is dropped when each forward's autocast region
  // ends. verbose: the units are always logged. Read so that a wrong type is reported.
  config.get_bool(prefix + "flatten_parameters");
  require(
      config.get_int(prefix + "bucket_cap_mb") >= 0,
      prefix + "bucket_cap_mb",
      "(given)",
      "an integer >= 0");
  config.get_bool(prefix + "clear_autocast_cache");
  config.get_bool(prefix + "verbose");
}

// DISTRIBUTED.PIPELINE_SIZE and MODEL.PIPELINE (docs/pipeline.md).
parallel::PipelineOptions pipeline_options_from(const Config& config) {
  parallel::PipelineOptions pipeline;
  pipeline.size = static_cast<int>(positive_int(config, "DISTRIBUTED.PIPELINE_SIZE"));
  const std::string key = "MODEL.PIPELINE.";
  parallel::PipelineParallelOptions& stages = pipeline.stages;
  const std::string schedule = config.get_string(key + "SCHEDULE");
  try {
    stages.schedule(parallel::parse_pipeline_schedule(schedule));
  } catch (const ConfigError&) {
    throw config_error(key + "SCHEDULE", schedule, "gpipe, 1f1b, interleaved_1f1b or zb_h1");
  }
  stages.num_microbatches(static_cast<int>(positive_int(config, key + "NUM_MICROBATCHES")));
  stages.virtual_stages(static_cast<int>(positive_int(config, key + "VIRTUAL_STAGES")));
  stages.boundaries(config.get_int_list(key + "BOUNDARIES"));
  stages.balance(parallel::parse_stage_balance(config.get_string(key + "BALANCE")));
  stages.checkpoint_stages(config.get_bool(key + "CHECKPOINT_STAGES"));
  return pipeline;
}

namespace {

// MODEL.HEAD.PARAMS' kwargs when its first head is a swav_head (VISSL's swav_loss takes that
// one head alone), else a null node.
YAML::Node swav_head_entry(const Config& config) {
  const YAML::Node params = config.node("MODEL.HEAD.PARAMS");
  const bool swav =
      params.IsSequence() && params.size() >= 1 && params[0].IsSequence() &&
      params[0].size() == 2 && params[0][0].IsScalar() &&
      head_architecture(config, params[0][0].Scalar(), "MODEL.HEAD.PARAMS[0]") == "swav_head";
  if (!swav) {
    return YAML::Node(YAML::NodeType::Undefined);
  }
  require(
      params.size() == 1 && params[0][1].IsMap(),
      "MODEL.HEAD.PARAMS",
      "(given)",
      "one head, [[\"swav_head\", {\"dims\": [...], \"num_clusters\": [...]}]] (VISSL's "
      "swav_loss takes one swav_head)");
  return params[0][1];
}

// MODEL.HEAD.PARAMS' kwargs when its first head is a dino_head (VISSL's dino_loss takes that
// one head alone), else a null node.
YAML::Node dino_head_entry(const Config& config) {
  const YAML::Node params = config.node("MODEL.HEAD.PARAMS");
  const bool dino =
      params.IsSequence() && params.size() >= 1 && params[0].IsSequence() &&
      params[0].size() == 2 && params[0][0].IsScalar() &&
      head_architecture(config, params[0][0].Scalar(), "MODEL.HEAD.PARAMS[0]") == "dino_head";
  if (!dino) {
    return YAML::Node(YAML::NodeType::Undefined);
  }
  require(
      params.size() == 1 && params[0][1].IsMap(),
      "MODEL.HEAD.PARAMS",
      "(given)",
      "one head, [[\"dino_head\", {\"in_dim\": ..., \"num_clusters\": [...]}]] (VISSL's "
      "dino_loss takes one dino_head)");
  return params[0][1];
}

} // namespace

models::ModelOptions model_options_from(const Config& config) {
  // in_channels / image_size / num_classes come from the data (0 = infer).
  models::ModelOptions model;
  model.in_channels = 0;
  model.image_size = 0;
  model.num_classes = 0;
  model.trunk_name = trunk_architecture(config); // VISSL's regnet_fsdp: regnet
  resnet_options_from(config, model.resnet);
  model.regnet = regnet_options_from(config);
  vit_options_from(config, model.vit);
  const auto& trunks = models::supported_trunk_names();
  require(
      std::find(trunks.begin(), trunks.end(), model.trunk_name) != trunks.end(),
      "MODEL.TRUNK.NAME",
      model.trunk_name,
      fmt::format("one of: {}", fmt::join(trunks, ", ")));
  model.mlp.hidden_dims = config.get_int_list("MODEL.TRUNK.MLP.HIDDEN_DIMS");
  require(
      std::all_of(
          model.mlp.hidden_dims.begin(),
          model.mlp.hidden_dims.end(),
          [](int64_t width) { return width > 0; }),
      "MODEL.TRUNK.MLP.HIDDEN_DIMS",
      fmt::format("[{}]", fmt::join(model.mlp.hidden_dims, ", ")),
      "a list of layer widths, each > 0");
  model.small_cnn.dropout = non_negative(config, "MODEL.TRUNK.SMALL_CNN.DROPOUT");
  model.head.batchnorm_eps = config.get_double("MODEL.HEAD.BATCHNORM_EPS");
  model.head.batchnorm_momentum = config.get_double("MODEL.HEAD.BATCHNORM_MOMENTUM");
  model.head_params_multiplier = config.get_double("MODEL.HEAD.PARAMS_MULTIPLIER");
  model.feature_eval = feature_eval_options_from(config);
  if (const YAML::Node swav = swav_head_entry(config)) {
    model.swav_head = swav_head_from(swav, "MODEL.HEAD.PARAMS[0]", model.head);
    return model;
  }
  if (const YAML::Node dino = dino_head_entry(config)) {
    model.dino_head = dino_head_from(dino, "MODEL.HEAD.PARAMS[0]");
    return model;
  }
  std::vector<models::EvalHeadOptions> heads = heads_from(config, model.head);
  if (!model.feature_eval.taps.empty()) {
    model.feature_eval.heads = heads; // one head per tapped feature
    models::validate_feature_eval_options(model.feature_eval);
    // The names by the trunk's kind (their stage and layer numbers are checked when the
    // trunk is built); a trunk that cannot be tapped is refused by the run plan, with why.
    const auto& tappable = models::tappable_trunk_names();
    if (std::find(tappable.begin(), tappable.end(), model.trunk_name) != tappable.end()) {
      models::validate_tap_features(models::tap_features(model.feature_eval), model.trunk_name);
    }
    return model;
  }
  const bool all_mlp =
      std::all_of(heads.begin(), heads.end(), [](const auto& head) { return head.name == "mlp"; });
  require(
      all_mlp,
      "MODEL.HEAD.PARAMS",
      "(given)",
      "mlp heads written as [[\"mlp\", {\"dims\": [in, ..., num_classes]}]] (eval_mlp heads "
      "need MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP)");
  if (heads.size() == 1) {
    model.head_dims = heads[0].dims;
    model.head = heads[0].mlp;
  } else { // run one after another (SimCLR's projection; run_plan.cpp checks the loss)
    for (const auto& head : heads) {
      model.head_chain.push_back(models::MlpHeadSpec{head.dims, head.mlp});
    }
  }
  return model;
}

namespace {

// DISTRIBUTED's pipeline and tensor-parallel sizes, and MODEL.ACTIVATION_CHECKPOINTING.
void model_parallel_options_from(const Config& config, TrainerOptions& options) {
  options.parallel.pipeline = pipeline_options_from(config);
  options.parallel.tensor_parallel_size =
      static_cast<int>(positive_int(config, "DISTRIBUTED.TENSOR_PARALLEL_SIZE"));
  options.parallel.sequence_parallel = config.get_bool("DISTRIBUTED.SEQUENCE_PARALLEL");
  // The trunk cut into NUM_ACTIVATION_CHECKPOINTING_SPLITS segments of balanced measured
  // activation bytes, every one but the last checkpointed (parallel/parallelize.h).
  const std::string checkpointing = "MODEL.ACTIVATION_CHECKPOINTING.";
  const int64_t num_splits =
      positive_int(config, checkpointing + "NUM_ACTIVATION_CHECKPOINTING_SPLITS");
  if (config.get_bool(checkpointing + "USE_ACTIVATION_CHECKPOINTING")) {
    options.parallel.activation_checkpointing.sequential = "trunk";
    options.parallel.activation_checkpointing.num_splits = num_splits;
  }
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
// MODEL.SHARDED_DDP_SETUP.USE_SDP its gradients sharded too). Returns whether the optimizer
// state is sharded, and so whether OPTIMIZER.base_optimizer describes the optimizer.
bool zero_options_from(const Config& config, TrainerOptions& options) {
  const bool zero_by_name = config.get_string("OPTIMIZER.name") == "zero";
  const bool shard_gradients = config.get_bool("MODEL.SHARDED_DDP_SETUP.USE_SDP");
  const bool shard_optimizer_state =
      zero_by_name || config.get_bool("OPTIMIZER.use_zero") || shard_gradients;
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

void distributed_options_from(const Config& config, TrainerOptions& options) {
  // NUM_NODES / NUM_PROC_PER_NODE / INIT_METHOD / RUN_ID decide how the
  // workers start (train/worker_launch.h); a worker learns its rank from the environment.
  auto& distributed = options.distributed;
  distributed.backend = config.get_string("DISTRIBUTED.BACKEND");
  require(
      distributed.backend == "gloo" || distributed.backend == "nccl",
      "DISTRIBUTED.BACKEND",
      distributed.backend,
      "gloo (CPU) or nccl (CUDA)");
  parallel::ParallelOptions& modes = options.parallel;
  const bool broadcast_buffers = config.get_bool("DISTRIBUTED.BROADCAST_BUFFERS");
  modes.ddp.broadcast_buffers = broadcast_buffers;
  modes.zero.broadcast_buffers = broadcast_buffers;
  modes.fsdp.broadcast_buffers = broadcast_buffers;
  const bool find_unused_parameters = config.get_bool("DISTRIBUTED.FIND_UNUSED_PARAMETERS");
  modes.ddp.find_unused_parameters = find_unused_parameters;
  modes.zero.find_unused_parameters = find_unused_parameters;
  modes.ddp.manual_reduction = config.get_bool("DISTRIBUTED.MANUAL_GRADIENT_REDUCTION");
  modes.ddp.delay_allreduce = config.get_bool("DISTRIBUTED.DELAY_ALLREDUCE");
  modes.ddp.bucket_cap_bytes = positive_int(config, "DATA.DDP_BUCKET_CAP_MB") * 1024 * 1024;
  distributed.rendezvous_timeout_seconds =
      positive_int(config, "DISTRIBUTED.RENDEZVOUS_TIMEOUT_SECONDS");
  distributed.collective_timeout_seconds =
      positive_int(config, "DISTRIBUTED.COLLECTIVE_TIMEOUT_SECONDS");
  if (auto fallback = run_id_master_port(config)) {
    distributed.run_id_master_port = fallback->port;
  }
  positive_int(config, "DISTRIBUTED.NUM_NODES");
  positive_int(config, "DISTRIBUTED.NUM_PROC_PER_NODE");
  options.gradient_accumulation_steps = positive_int(config, "TRAINER.GRADIENT_ACCUMULATION_STEPS");
  // Manual reduction is DistributedDataParallel's; ZeRO stage 2 and FSDP reduce (and scatter)
  // gradients from their own hooks, so the switch would change nothing there.
  if (modes.ddp.manual_reduction && parallel::zero_stage(modes.data_parallelism) >= 2) {
    const bool fsdp = modes.data_parallelism == parallel::DataParallelism::kFsdp;
    throw config_error(
        "DISTRIBUTED.MANUAL_GRADIENT_REDUCTION",
        "True",
        fmt::format(
            "False with {}: it applies to DistributedDataParallel, and {} "
            "reduces gradients in its own hooks",
            fsdp ? "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP" : "MODEL.SHARDED_DDP_SETUP.USE_SDP",
            fsdp ? "FSDP" : "ZeRO stage 2"));
  }
}

} // namespace

namespace {

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

checkpoint::WeightsInitOptions
weights_init_options_from(const Config& config, const models::ModelOptions& model) {
  const std::string key = "MODEL.WEIGHTS_INIT.";
  checkpoint::WeightsInitOptions options;
  options.params_file = config.get_string(key + "PARAMS_FILE");
  const std::string state_key = config.get_string(key + "STATE_DICT_KEY_NAME");
  options.state_dict_key_name =
      state_key.empty() ? std::vector<std::string>{} : std::vector<std::string>{state_key};
  options.skip_layers = config.get_string_list(key + "SKIP_LAYERS");
  options.remove_prefix = config.get_string(key + "REMOVE_PREFIX");
  options.append_prefix = config.get_string(key + "APPEND_PREFIX");
  options.init_heads = model.feature_eval.init_heads_from_weights();
  options.check_head_shapes = model.feature_eval.assert_head_layer_shape_init;
  options.rename = models::weights_name_mapping(model); // VISSL's and torchvision's names
  return options;
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
