// MODEL's trunk, head and feature-evaluation keys (include/largo/train/model_config.h).
#include <largo/train/model_config.h>

#include "config_checks.h"
#include "regnet_config.h"
#include "self_supervised_config.h"
#include "vissl_fsdp_names.h"

#include <largo/core/config_value.h>
#include <largo/models/feature_taps.h>
#include <largo/models/resnet.h>
#include <largo/models/vissl_names.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace largo::train {
namespace {

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

// MODEL.TRUNK.RESNETS_SK (models/resnet_sk.h checks the values when the trunk is built).
models::ResNetSkOptions resnet_sk_options_from(const Config& config) {
  const std::string key = "MODEL.TRUNK.RESNETS_SK.";
  models::ResNetSkOptions options;
  options.depth = config.get_int(key + "DEPTH");
  options.width_multiplier = positive_int(config, key + "WIDTH_MULTIPLIER");
  options.sk_ratio = non_negative(config, key + "SK_RATIO");
  return options;
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

// Each value under MODEL.TRUNK.TRUNK_PARAMS (`path` below it) must equal the one in effect at
// MODEL.TRUNK.<path>: VISSL's code never reads TRUNK_PARAMS (a few of its configs write
// {RESNETS: {DEPTH: 50}} there), so where it repeats the trunk's keys it changes nothing in
// either, and where it does not, the run would not be the one its author meant.
void check_trunk_params_repeat(
    const Config& config, const YAML::Node& value, const std::string& path) {
  const std::string key = "MODEL.TRUNK.TRUNK_PARAMS" + path;
  require(
      value.IsMap() || !path.empty(),
      key,
      config_value_text(value),
      "a map of the trunk's keys as they are in effect, e.g. {RESNETS: {DEPTH: 50}}");
  if (value.IsMap()) {
    for (const auto& entry : value) {
      check_trunk_params_repeat(config, entry.second, path + "." + entry.first.Scalar());
    }
    return;
  }
  const std::string effective_key = "MODEL.TRUNK" + path;
  const bool repeats = !path.empty() && config.has(effective_key) &&
                       same_config_value(config.node(effective_key), value);
  require(
      repeats,
      key,
      config_value_text(value),
      fmt::format(
          "the value in effect at {} ({}): VISSL never reads MODEL.TRUNK.TRUNK_PARAMS and builds "
          "the trunk from {}; set the value there and remove TRUNK_PARAMS",
          effective_key,
          config.has(effective_key) ? config_value_text(config.node(effective_key)) : "unset",
          effective_key));
}

// MODEL.HEAD.PARAMS: VISSL's [[name, {kwargs}], ...], one entry per head (mlp or eval_mlp),
// from entry `first` on. `defaults` carries MODEL.HEAD.BATCHNORM_EPS / MOMENTUM.
std::vector<models::EvalHeadOptions>
heads_from(const Config& config, const models::MlpHeadOptions& defaults, size_t first = 0) {
  const std::string key = "MODEL.HEAD.PARAMS";
  const YAML::Node list = config.node(key);
  require(list.IsSequence(), key, "(not a list)", "a list of [name, {kwargs}] heads");
  std::vector<models::EvalHeadOptions> heads;
  for (size_t i = first; i < list.size(); ++i) {
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
    require(
        options.name != "eval_mlp" || options.in_channels > 0,
        head_key + ".in_channels",
        std::to_string(options.in_channels),
        "the channels of the eval_mlp head's BatchNorm, > 0 (VISSL requires it)");
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

// Whether MODEL.HEAD.PARAMS' first head is `architecture` (VISSL's *_fsdp names included).
bool first_head_is(const Config& config, const std::string& architecture) {
  const YAML::Node params = config.node("MODEL.HEAD.PARAMS");
  return params.IsSequence() && params.size() >= 1 && params[0].IsSequence() &&
         params[0].size() == 2 && params[0][0].IsScalar() &&
         head_architecture(config, params[0][0].Scalar(), "MODEL.HEAD.PARAMS[0]") == architecture;
}

// MODEL.HEAD.PARAMS' kwargs when its first head is `architecture` (swav_head, dino_head: their
// VISSL losses take that one head alone), else a null node. `kwargs` shows its form.
YAML::Node
sole_head_entry(const Config& config, const std::string& architecture, const std::string& kwargs) {
  const YAML::Node params = config.node("MODEL.HEAD.PARAMS");
  if (!first_head_is(config, architecture)) {
    return YAML::Node(YAML::NodeType::Undefined);
  }
  require(
      params.size() == 1 && params[0][1].IsMap(),
      "MODEL.HEAD.PARAMS",
      "(given)",
      fmt::format(
          "one head, [[\"{}\", {}]] (VISSL's loss for it takes one {})",
          architecture,
          kwargs,
          architecture));
  return params[0][1];
}

// VISSL's fine-tuning of a SwAV checkpoint writes a swav_head without prototypes first, as
// the projection before the classifier ([["swav_head", {"dims": [3024, 4096], "use_bn": True,
// "num_clusters": []}], ["mlp", {"dims": [4096, 1000]}]]): VISSL runs its heads one after
// another, its mlp taking the swav_head's one-entry list. The swav_head's projection is an
// mlp's layers, so the heads become a chain (models::MlpHeadSpec) whose first entry keeps
// VISSL's module name for a checkpoint's projection to load.
std::vector<models::MlpHeadSpec>
swav_projection_chain_from(const Config& config, const models::MlpHeadOptions& defaults) {
  const std::string key = "MODEL.HEAD.PARAMS[0]";
  const YAML::Node kwargs = config.node("MODEL.HEAD.PARAMS")[0][1];
  require(kwargs.IsMap(), key, "(given)", "[\"swav_head\", {\"dims\": [...], ...}]");
  const models::SwavHeadOptions swav = swav_head_from(kwargs, key, defaults);
  const std::string why = "when other heads follow the swav_head (VISSL's next head takes the "
                          "projection's embedding alone)";
  require(
      swav.num_clusters.empty(),
      key + ".num_clusters",
      fmt::format("[{}]", fmt::join(swav.num_clusters, ", ")),
      "[] " + why);
  require(swav.activation == "ReLU", key + ".activation_name", swav.activation, "ReLU " + why);
  models::MlpHeadSpec projection;
  projection.dims = swav.dims;
  projection.options = defaults;
  projection.options.use_bn = swav.use_bn;
  projection.options.use_relu = true;
  projection.options.use_bias = swav.use_bias;
  projection.options.skip_last_layer_relu_bn = swav.skip_last_bn;
  projection.normalize_output = swav.normalize_feats;
  projection.vissl_module = "projection_head";
  std::vector<models::MlpHeadSpec> chain{projection};
  const std::vector<models::EvalHeadOptions> heads = heads_from(config, defaults, /*first=*/1);
  for (size_t i = 0; i < heads.size(); ++i) {
    require(
        heads[i].name == "mlp",
        fmt::format("MODEL.HEAD.PARAMS[{}]", i + 1),
        heads[i].name,
        "mlp after a swav_head (eval_mlp's BatchNorm2d takes a trunk's feature maps)");
    chain.push_back(models::MlpHeadSpec{heads[i].dims, heads[i].mlp});
  }
  return chain;
}

// DATA.TRAIN.COLLATE_FUNCTION_PARAMS: {} or VISSL's multicrop_collator
// {create_multidimensional_tensor: bool}, whose True pads the crops to the largest and runs
// them through the trunk in one pass (ModelOptions::pad_views). VISSL's regnet and resnext
// trunks take that input; its DINO and MoCo models do not.
bool pad_views_from(const Config& config, const std::string& trunk) {
  const std::string key = "DATA.TRAIN.COLLATE_FUNCTION_PARAMS";
  const YAML::Node params = config.node(key);
  require(
      params.IsMap(),
      key,
      config_value_text(params),
      "a map: {} or {create_multidimensional_tensor: True} with multicrop_collator");
  if (params.size() == 0) {
    return false;
  }
  const std::string collator = config.get_string("DATA.TRAIN.COLLATE_FUNCTION");
  const YAML::Node flag = params["create_multidimensional_tensor"];
  require(
      params.size() == 1 && flag && collator == "multicrop_collator",
      key,
      config_value_text(params),
      fmt::format(
          "{{}}: {} takes no parameters here; multicrop_collator takes "
          "create_multidimensional_tensor",
          collator));
  const bool pad = yaml_to_bool(flag, key + ".create_multidimensional_tensor");
  const std::string loss = config.get_string("LOSS.name");
  require(
      !pad ||
          ((trunk == "regnet" || trunk == "resnet") && loss != "dino_loss" && loss != "moco_loss"),
      key + ".create_multidimensional_tensor",
      "True",
      fmt::format(
          "False with MODEL.TRUNK.NAME {} and LOSS.name {}: padded crops run through a resnet or "
          "regnet trunk (whose pool averages each crop's unpadded part), not DINO's or MoCo's "
          "models",
          trunk,
          loss));
  return pad;
}

} // namespace

models::ModelOptions model_options_from(const Config& config) {
  // in_channels / image_size / num_classes come from the data (0 = infer).
  models::ModelOptions model;
  model.in_channels = 0;
  model.image_size = 0;
  model.num_classes = 0;
  model.trunk_name = trunk_architecture(config); // VISSL's regnet_fsdp: regnet
  check_trunk_params_repeat(config, config.node("MODEL.TRUNK.TRUNK_PARAMS"), "");
  resnet_options_from(config, model.resnet);
  model.resnet_sk = resnet_sk_options_from(config);
  model.regnet = regnet_options_from(config);
  model.pad_views = pad_views_from(config, model.trunk_name);
  vit_options_from(config, model.vit);
  // Largo's MODEL.FUSED_KERNELS: the convolutional trunks' BatchNorm + ReLU (+ add), the ViT's
  // bias + GELU and residual add + LayerNorm.
  const bool fused_kernels = config.get_bool("MODEL.FUSED_KERNELS");
  model.resnet.norm.fuse_relu = fused_kernels;
  model.regnet.fuse_relu = fused_kernels;
  model.vit.fused_kernels =
      fused_kernels ? models::VitFusedKernels::kOnCuda : models::VitFusedKernels::kNever;
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
  if (model.feature_eval.taps.empty() && first_head_is(config, "swav_head") &&
      config.node("MODEL.HEAD.PARAMS").size() > 1) {
    model.head_chain = swav_projection_chain_from(config, model.head);
    return model;
  }
  if (const YAML::Node swav =
          sole_head_entry(config, "swav_head", R"({"dims": [...], "num_clusters": [...]})")) {
    model.swav_head = swav_head_from(swav, "MODEL.HEAD.PARAMS[0]", model.head);
    require(
        !model.swav_head.num_clusters.empty(),
        "MODEL.HEAD.PARAMS[0].num_clusters",
        "[]",
        "at least one prototype set, [K, ...] (without prototypes a swav_head is a projection "
        "that a classifier's mlp head must follow)");
    return model;
  }
  if (const YAML::Node dino =
          sole_head_entry(config, "dino_head", R"({"in_dim": ..., "num_clusters": [...]})")) {
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
      all_mlp || heads.size() == 1,
      "MODEL.HEAD.PARAMS",
      "(given)",
      "one eval_mlp head, or mlp heads written as [[\"mlp\", {\"dims\": [in, ..., "
      "num_classes]}]] (several eval_mlp heads need "
      "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP)");
  if (heads.size() == 1) {
    model.head_dims = heads[0].dims;
    model.head = heads[0].mlp;
    // eval_mlp on the trunk's output: VISSL's BatchNorm over its channels, then the mlp.
    model.head_channel_bn = heads[0].name == "eval_mlp" ? heads[0].in_channels : 0;
  } else { // run one after another (SimCLR's projection; run_plan.cpp checks the loss)
    for (const auto& head : heads) {
      model.head_chain.push_back(models::MlpHeadSpec{head.dims, head.mlp});
    }
  }
  return model;
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

} // namespace largo::train
