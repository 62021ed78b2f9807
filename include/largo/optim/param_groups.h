// Splits a model's parameters into optimizer groups with VISSL's weight-decay rules:
// norm layers and biases can be left unregularized, name substrings can opt out, and the
// head ("head.*") gets its own groups so it can have its own decay and learning rate.
//
// Groups, in this order, each dropped when empty:
//   "trunk"        trunk parameters that are decayed          (weight_decay)
//   "trunk_no_wd"  trunk parameters that are not decayed      (0)
//   "head"         head parameters that are decayed           (head_weight_decay or weight_decay)
//   "head_no_wd"   head parameters that are not decayed       (0)
// Parameter names are the module's named_parameters() names ("trunk.0.bn.weight").
//
// VISSL's "dino" constructor (ParamGroupOptions::rule kDino) instead makes two groups over the
// whole model, trunk and head together, by name alone:
//   "decayed"      every other parameter                        (weight_decay)
//   "not_decayed"  names ending in ".bias" or holding "norm"     (0)
// Largo's ViT and DINO head keep VISSL's module names (norm1, norm2, norm; mlp, prototypes0),
// so the rule picks the same parameters as in VISSL. The norm-layer, bias, head and name-list
// options above are not read under it.
//
// VISSL's construct_single_param_group_only (ParamGroupOptions::rule kSingle) makes one group
// of every trained parameter, all decayed, as VISSL's FSDP setups ask:
//   "all"          every parameter                              (weight_decay)
// The norm-layer, bias, head and name-list options are not read under it either.
#pragma once

#include <largo/optim/optimizer.h>

#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

namespace largo::optim {

// OPTIMIZER.param_group_constructor (kDefault, kDino) and its default constructor's
// construct_single_param_group_only (kSingle)
enum class ParamGroupRule { kDefault, kDino, kSingle };

struct ParamGroupOptions {
  ParamGroupRule rule = ParamGroupRule::kDefault;
  double lr = 0.1;             // initial lr of every group; the schedule sets it later
  double weight_decay = 1e-4;  // OPTIMIZER.weight_decay
  bool regularize_bn = false;  // OPTIMIZER.regularize_bn: decay norm-layer parameters
  bool regularize_bias = true; // OPTIMIZER.regularize_bias: decay "*bias" parameters
  std::vector<std::string> non_regularized_parameters; // name substrings that get no decay
  bool use_different_wd = false;     // OPTIMIZER.head_optimizer_params.use_different_wd
  double head_weight_decay = 1e-4;   // OPTIMIZER.head_optimizer_params.weight_decay
  std::string head_prefix = "head."; // parameters whose name starts with this are the head
  // Which modules count as norm layers; empty means is_norm_layer() below. Set it when the
  // model uses norm modules of its own (e.g. a synchronized BatchNorm).
  std::function<bool(const torch::nn::Module&)> is_norm_layer;
};

// Which weight decay a group of build_param_groups takes, so that a schedule of it can set
// the group's value: "trunk", "decayed" and "all" OPTIMIZER.weight_decay's, "head" the head's,
// the others none (0).
enum class DecaySource { kNone, kWeightDecay, kHeadWeightDecay };
DecaySource decay_source(const std::string& group_name);

// BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d, LayerNorm and GroupNorm.
bool is_norm_layer(const torch::nn::Module& module);

// Parameters with requires_grad = false are left out; each parameter appears once even
// when modules share it.
std::vector<ParamGroup>
build_param_groups(const torch::nn::Module& model, const ParamGroupOptions& options);

// The names (as in build_param_groups) of the parameters of norm layers and of parameters
// named "*bias": what LARS practice leaves out of layer-wise adaptation
// (OPTIMIZER.larc_config.exclude_bias_and_norm fills LARCOptions::excluded_from_adaptation
// with them). is_norm_layer as in ParamGroupOptions; empty means is_norm_layer() above.
std::vector<std::string> bias_and_norm_parameter_names(
    const torch::nn::Module& model,
    const std::function<bool(const torch::nn::Module&)>& is_norm_layer = {});

// The names of the trained parameters with one dimension (biases, norm layers' weights):
// what VISSL's lars leaves out of its adaptation with exclude_bias_and_norm (p.ndim == 1).
// Taken from the whole parameters, because a sharded optimizer sees 1-D pieces of all of
// them (OPTIMIZER.exclude_bias_and_norm fills LARSOptions::excluded_from_adaptation).
std::vector<std::string> one_dimensional_parameter_names(const torch::nn::Module& model);

} // namespace largo::optim
