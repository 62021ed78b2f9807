#include "self_supervised_config.h"

#include "config_checks.h"

#include <largo/core/config_value.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace largo::train {
namespace {

// A key VISSL computes from the rest of the config (and overwrites): set to anything but its
// default, or `inferred` (the value VISSL copies into it, where the config holds it), it would
// change nothing. (Undefined, not YAML::Node(), which is a null a key set to null would equal.)
void refuse_inferred(
    const Config& config,
    const std::string& key,
    const std::string& from,
    const YAML::Node& inferred = YAML::Node(YAML::NodeType::Undefined)) {
  const YAML::Node value = config.node(key);
  const YAML::Node vissl_default = Config::defaults().node(key);
  const std::string text = config_value_text(value);
  if (text != config_value_text(vissl_default) &&
      !(inferred.IsDefined() && text == config_value_text(inferred))) {
    throw config_error(
        key,
        config_value_text(value),
        fmt::format(
            "the key left out (or VISSL's default {}): it is inferred from {}, and VISSL "
            "overwrites it too",
            config_value_text(vissl_default),
            from));
  }
}

// What VISSL's infer_losses_config copies into LOSS.swav_loss: the total_num_crops of the
// first DATA.TRAIN.TRANSFORMS entry that has one (num_crops), and the first head's
// num_clusters (num_prototypes). Undefined where the config does not hold them.
YAML::Node multicrop_total(const Config& config) {
  for (const YAML::Node& transform : config.node("DATA.TRAIN.TRANSFORMS")) {
    if (transform.IsMap() && transform["total_num_crops"]) {
      return transform["total_num_crops"];
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

YAML::Node first_head_clusters(const Config& config) {
  const YAML::Node heads = config.node("MODEL.HEAD.PARAMS");
  if (heads.IsSequence() && heads.size() > 0 && heads[0].IsSequence() && heads[0].size() > 1 &&
      heads[0][1].IsMap() && heads[0][1]["num_clusters"]) {
    return heads[0][1]["num_clusters"];
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

SelfSupervisedLossOptions swav_options_from(const Config& config) {
  const std::string key = "LOSS.swav_loss.";
  SelfSupervisedLossOptions options;
  options.name = "swav_loss";
  models::SwavLossOptions& swav = options.swav;
  swav.temperature = positive_number(config, key + "temperature");
  swav.epsilon = positive_number(config, key + "epsilon");
  swav.num_iters = positive_int(config, key + "num_iters");
  swav.crops_for_assign = config.get_int_list(key + "crops_for_assign");
  swav.use_double_precision = config.get_bool(key + "use_double_precision");
  options.normalize_last_layer = config.get_bool(key + "normalize_last_layer");
  options.temp_hard_assignment_iters = non_negative_int(config, key + "temp_hard_assignment_iters");
  options.queue_length = non_negative_int(config, key + "queue.queue_length"); // 0: no queue
  options.queue_start_iter = non_negative_int(config, key + "queue.start_iter");
  refuse_inferred(
      config, key + "num_crops", "DATA.TRAIN.TRANSFORMS' crops", multicrop_total(config));
  refuse_inferred(
      config, key + "num_prototypes", "the swav_head's num_clusters", first_head_clusters(config));
  refuse_inferred(config, key + "embedding_dim", "the swav_head's last dim");
  refuse_inferred(config, key + "queue.local_queue_length", "queue_length and the world size");
  refuse_inferred(config, key + "output_dir", "CHECKPOINT.DIR");
  return options;
}

SelfSupervisedLossOptions simclr_options_from(const Config& config) {
  const std::string key = "LOSS.simclr_info_nce_loss.";
  SelfSupervisedLossOptions options;
  options.name = "simclr_info_nce_loss";
  options.simclr.temperature = positive_number(config, key + "temperature");
  options.simclr_embedding_dim = positive_int(config, key + "buffer_params.embedding_dim");
  refuse_inferred(config, key + "buffer_params.world_size", "the world size");
  refuse_inferred(
      config, key + "buffer_params.effective_batch_size", "the batch size and the world size");
  return options;
}

SelfSupervisedLossOptions barlow_twins_options_from(const Config& config) {
  const std::string key = "LOSS.barlow_twins_loss.";
  SelfSupervisedLossOptions options;
  options.name = "barlow_twins_loss";
  options.barlow_twins.lambda = config.get_double(key + "lambda_");
  require(
      options.barlow_twins.lambda >= 0.0,
      key + "lambda_",
      fmt::format("{}", options.barlow_twins.lambda),
      "a number >= 0 (the off-diagonal terms' weight)");
  options.barlow_twins.scale_loss = positive_number(config, key + "scale_loss");
  options.barlow_twins_embedding_dim = positive_int(config, key + "embedding_dim");
  return options;
}

SelfSupervisedLossOptions moco_options_from(const Config& config) {
  const std::string key = "LOSS.moco_loss.";
  SelfSupervisedLossOptions options;
  options.name = "moco_loss";
  options.moco.temperature = positive_number(config, key + "temperature");
  options.moco_queue_size = positive_int(config, key + "queue_size");
  options.moco_embedding_dim = positive_int(config, key + "embedding_dim");
  return options;
}

// LOSS.dino_loss: the loss's keys (num_crops is the data's crop count, output_dim the
// dino_head's num_clusters, both inferred as VISSL does) and the teacher's momentum.
SelfSupervisedLossOptions dino_options_from(const Config& config) {
  const std::string key = "LOSS.dino_loss.";
  SelfSupervisedLossOptions options;
  options.name = "dino_loss";
  models::DinoLossOptions& dino = options.dino;
  dino.student_temp = positive_number(config, key + "student_temp");
  dino.teacher_temp_min = positive_number(config, key + "teacher_temp_min");
  dino.teacher_temp_max = positive_number(config, key + "teacher_temp_max");
  dino.teacher_temp_warmup_iters = non_negative_int(config, key + "teacher_temp_warmup_iters");
  dino.crops_for_teacher = config.get_int_list(key + "crops_for_teacher");
  require(
      !dino.crops_for_teacher.empty(),
      key + "crops_for_teacher",
      "[]",
      "the crops the teacher sees, e.g. [0, 1] (the global crops)");
  dino.center_momentum = config.get_double(key + "ema_center");
  require(
      dino.center_momentum >= 0.0 && dino.center_momentum <= 1.0,
      key + "ema_center",
      fmt::format("{}", dino.center_momentum),
      "a number in [0, 1] (VISSL's 0.9)");
  options.dino_momentum = config.get_double(key + "momentum");
  require(
      options.dino_momentum >= 0.0 && options.dino_momentum <= 1.0,
      key + "momentum",
      fmt::format("{}", options.dino_momentum),
      "a number in [0, 1] (VISSL's 0.996: the teacher keeps 99.6 % of itself at first)");
  refuse_inferred(config, key + "output_dim", "the dino_head's num_clusters");
  return options;
}

// LOSS.deepclusterv2_loss: the loss's temperature and the memory's clustering keys. VISSL
// overwrites DROP_LAST, BATCHSIZE_PER_REPLICA, num_crops and num_train_samples from DATA.TRAIN
// and the dataset whatever they are set to (its own configs set them), so they are not read:
// the trainer infers them alike.
SelfSupervisedLossOptions deepclusterv2_options_from(const Config& config) {
  const std::string key = "LOSS.deepclusterv2_loss.";
  SelfSupervisedLossOptions options;
  options.name = "deepclusterv2_loss";
  options.deepclusterv2.temperature = positive_number(config, key + "temperature");
  models::DeepClusterV2MemoryOptions& memory = options.deepclusterv2_memory;
  memory.num_clusters = config.get_int_list(key + "num_clusters");
  require(
      !memory.num_clusters.empty() &&
          *std::min_element(memory.num_clusters.begin(), memory.num_clusters.end()) > 0,
      key + "num_clusters",
      fmt::format("[{}]", fmt::join(memory.num_clusters, ", ")),
      "one or more cluster counts, each > 0 (one k-means head each, e.g. [3000, 3000, 3000])");
  memory.kmeans_iters = non_negative_int(config, key + "kmeans_iters");
  memory.crops_for_mb = config.get_int_list(key + "memory_params.crops_for_mb");
  require(
      !memory.crops_for_mb.empty(),
      key + "memory_params.crops_for_mb",
      "[]",
      "the crops whose embeddings the memory keeps, e.g. [0]");
  memory.embedding_dim = positive_int(config, key + "memory_params.embedding_dim");
  return options;
}

// VISSL names parameters of the wrapped model ("module.heads.0.prototypes0.weight"); Largo's
// module has "head.0.prototypes0.weight".
std::string largo_parameter_name(std::string name) {
  const std::string module = "module.";
  if (name.rfind(module, 0) == 0) {
    name = name.substr(module.size());
  }
  const std::string heads = "heads.";
  if (name.rfind(heads, 0) == 0) {
    name = "head." + name.substr(heads.size());
  }
  return name;
}

void frozen_parameters_from(const Config& config, SelfSupervisedLossOptions& options) {
  const std::string key = "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP";
  const YAML::Node list = config.node(key);
  require(list.IsSequence(), key, config_value_text(list), "a list of [parameter name, iteration]");
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node entry = list[i];
    const std::string entry_key = fmt::format("{}[{}]", key, i);
    require(
        entry.IsSequence() && entry.size() == 2 && entry[0].IsScalar(),
        entry_key,
        config_value_text(entry),
        "[parameter name, iteration], e.g. ['module.heads.0.prototypes0.weight', 313]");
    const int64_t iteration = yaml_to_int(entry[1], entry_key);
    require(iteration >= 0, entry_key, std::to_string(iteration), "an iteration >= 0");
    options.frozen_parameters.emplace_back(largo_parameter_name(entry[0].Scalar()), iteration);
  }
}

std::vector<int64_t> int_list(const YAML::Node& node, const std::string& key) {
  require(node.IsSequence(), key, config_value_text(node), "a list of integers");
  std::vector<int64_t> values;
  for (const auto& value : node) {
    values.push_back(yaml_to_int(value, key));
  }
  return values;
}

} // namespace

SelfSupervisedLossOptions self_supervised_options_from(const Config& config) {
  const std::string loss = config.get_string("LOSS.name");
  SelfSupervisedLossOptions options;
  if (loss == "swav_loss") {
    options = swav_options_from(config);
  } else if (loss == "simclr_info_nce_loss") {
    options = simclr_options_from(config);
  } else if (loss == "barlow_twins_loss") {
    options = barlow_twins_options_from(config);
  } else if (loss == "moco_loss") {
    options = moco_options_from(config);
  } else if (loss == "dino_loss") {
    options = dino_options_from(config);
  } else if (loss == "deepclusterv2_loss") {
    options = deepclusterv2_options_from(config);
  }
  frozen_parameters_from(config, options);
  return options;
}

std::optional<models::MocoModelOptions> moco_model_options_from(const Config& config) {
  if (config.get_string("LOSS.name") != "moco_loss") {
    return std::nullopt;
  }
  const std::string key = "LOSS.moco_loss.";
  models::MocoModelOptions options;
  options.momentum = config.get_double(key + "momentum");
  require(
      options.momentum >= 0.0 && options.momentum <= 1.0,
      key + "momentum",
      fmt::format("{}", options.momentum),
      "a number in [0, 1] (VISSL's 0.999: the momentum encoder keeps 99.9 % of itself)");
  options.shuffle_batch = config.get_bool(key + "shuffle_batch");
  const bool sync_batch_norm = config.get_bool("MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN");
  require(
      !(options.shuffle_batch && sync_batch_norm),
      key + "shuffle_batch",
      "True",
      "False with MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN True: VISSL shuffles the keys' "
      "batch only without SyncBatchNorm, so set shuffle_batch: False (or turn SyncBatchNorm "
      "off)");
  options.shuffle_seed = static_cast<uint64_t>(config.get_int("SEED_VALUE"));
  return options;
}

std::optional<models::DinoModelOptions> dino_model_options_from(const Config& config) {
  if (config.get_string("LOSS.name") != "dino_loss") {
    return std::nullopt;
  }
  models::DinoModelOptions options;
  options.crops_for_teacher = config.get_int_list("LOSS.dino_loss.crops_for_teacher");
  return options;
}

namespace {

// One dino_head argument `name` = `value` into `options`; false for a name it does not take.
bool dino_head_argument(
    const std::string& name,
    const YAML::Node& value,
    const std::string& arg_key,
    models::DinoHeadOptions& options) {
  if (name == "in_dim") {
    options.in_dim = yaml_to_int(value, arg_key);
  } else if (name == "num_clusters") {
    const std::vector<int64_t> clusters = int_list(value, arg_key);
    require(
        clusters.size() == 1,
        arg_key,
        config_value_text(value),
        "one output width, e.g. [65536] (VISSL's dino_head takes one)");
    options.num_clusters = clusters.front();
  } else if (name == "use_bn") {
    options.use_bn = yaml_to_bool(value, arg_key);
  } else if (name == "normalize_last_layer") {
    options.normalize_last_layer = yaml_to_bool(value, arg_key);
  } else if (name == "num_layers") {
    options.num_layers = yaml_to_int(value, arg_key);
  } else if (name == "hidden_dim") {
    options.hidden_dim = yaml_to_int(value, arg_key);
  } else if (name == "bottleneck_dim") {
    options.bottleneck_dim = yaml_to_int(value, arg_key);
  } else {
    return false;
  }
  return true;
}

} // namespace

models::DinoHeadOptions dino_head_from(const YAML::Node& kwargs, const std::string& key) {
  models::DinoHeadOptions options;
  for (const auto& entry : kwargs) {
    const std::string name = entry.first.as<std::string>();
    require(
        dino_head_argument(name, entry.second, key + "." + name, options),
        key + "." + name,
        "(given)",
        "a dino_head argument: in_dim, num_clusters, use_bn, normalize_last_layer, num_layers, "
        "hidden_dim, bottleneck_dim");
  }
  require(
      options.in_dim > 0 && options.num_clusters > 0,
      key,
      "(given)",
      "[\"dino_head\", {\"in_dim\": trunk width, \"num_clusters\": [K]}] with both > 0");
  return options;
}

models::SwavHeadOptions swav_head_from(
    const YAML::Node& kwargs, const std::string& key, const models::MlpHeadOptions& defaults) {
  models::SwavHeadOptions options;
  options.batchnorm_eps = defaults.batchnorm_eps;
  options.batchnorm_momentum = defaults.batchnorm_momentum;
  for (const auto& entry : kwargs) {
    const std::string name = entry.first.as<std::string>();
    const std::string arg_key = key + "." + name;
    const YAML::Node& value = entry.second;
    if (name == "dims") {
      options.dims = int_list(value, arg_key);
    } else if (name == "num_clusters") {
      options.num_clusters = int_list(value, arg_key);
    } else if (name == "use_bn") {
      options.use_bn = yaml_to_bool(value, arg_key);
    } else if (name == "use_bias") {
      options.use_bias = yaml_to_bool(value, arg_key);
    } else if (name == "return_embeddings") {
      require(
          yaml_to_bool(value, arg_key),
          arg_key,
          "False",
          "True: swav_loss keeps the embeddings in its queue");
    } else if (name == "skip_last_bn") {
      options.skip_last_bn = yaml_to_bool(value, arg_key);
    } else if (name == "normalize_feats") {
      options.normalize_feats = yaml_to_bool(value, arg_key);
    } else if (name == "activation_name") {
      options.activation = value.Scalar();
    } else {
      throw config_error(
          arg_key,
          "(given)",
          "a swav_head argument: dims, use_bn, num_clusters, use_bias, return_embeddings, "
          "skip_last_bn, normalize_feats, activation_name");
    }
  }
  require(
      options.dims.size() >= 2,
      key,
      "(given)",
      "[\"swav_head\", {\"dims\": [trunk width, ..., embedding], \"num_clusters\": [K, ...]}]");
  return options;
}

} // namespace largo::train
