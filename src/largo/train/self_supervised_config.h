// LOSS.swav_loss / LOSS.simclr_info_nce_loss / LOSS.barlow_twins_loss / LOSS.moco_loss /
// LOSS.dino_loss, a swav_head or dino_head in MODEL.HEAD.PARAMS and
// MODEL.TEMP_FROZEN_PARAMS_ITER_MAP -> the typed options of a self-supervised run
// (self_supervised_loss.h, models::SwavHeadOptions). VISSL infers some of these keys from the rest
// of the config and overwrites what is set (num_crops, num_prototypes, embedding_dim, world_size,
// ...): Largo infers them alike and refuses a value set to anything but VISSL's default, since it
// would change nothing. Private to the train layer.
#pragma once

#include <largo/core/config.h>
#include <largo/models/dino_head.h>
#include <largo/models/dino_model.h>
#include <largo/models/heads.h>
#include <largo/models/swav_head.h>
#include <largo/train/self_supervised_loss.h>

#include <yaml-cpp/yaml.h>

#include <optional>
#include <string>

namespace largo::train {

// LOSS.<name> for LOSS.name swav_loss, simclr_info_nce_loss, barlow_twins_loss, moco_loss or
// dino_loss
// (options.name empty for any other loss), and MODEL.TEMP_FROZEN_PARAMS_ITER_MAP with VISSL's
// "module.heads.<i>." names read as Largo's "head.<i>.". Throws ConfigError naming the key.
SelfSupervisedLossOptions self_supervised_options_from(const Config& config);

// LOSS.moco_loss.momentum and shuffle_batch (and SEED_VALUE, the shuffle's seed) for
// LOSS.name moco_loss: the MocoModel's options; nullopt for any other loss. Throws ConfigError
// naming the key (shuffle_batch with CONVERT_BN_TO_SYNC_BN, where VISSL does not shuffle).
std::optional<models::MocoModelOptions> moco_model_options_from(const Config& config);

// LOSS.dino_loss.crops_for_teacher for LOSS.name dino_loss: the DinoModel's options; nullopt
// for any other loss.
std::optional<models::DinoModelOptions> dino_model_options_from(const Config& config);

// One MODEL.HEAD.PARAMS entry ["dino_head", {...}] (`kwargs` its map, `key` its
// "MODEL.HEAD.PARAMS[i]"): VISSL's arguments in_dim, num_clusters (a one-entry list),
// use_bn, normalize_last_layer, num_layers, hidden_dim, bottleneck_dim. Throws ConfigError
// naming the argument (the widths' ranges are DinoHeadImpl's checks, named by option_keys).
models::DinoHeadOptions dino_head_from(const YAML::Node& kwargs, const std::string& key);

// One MODEL.HEAD.PARAMS entry ["swav_head", {...}] (`head` its kwargs map, `key` its
// "MODEL.HEAD.PARAMS[i]"): VISSL's arguments dims, use_bn, num_clusters, use_bias,
// return_embeddings (True: the loss needs the embedding), skip_last_bn, normalize_feats,
// activation_name. Throws ConfigError naming the argument. num_clusters may be empty (a
// projection before other heads); the caller checks what its use needs.
models::SwavHeadOptions swav_head_from(
    const YAML::Node& kwargs, const std::string& key, const models::MlpHeadOptions& defaults);

} // namespace largo::train
