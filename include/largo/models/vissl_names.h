// Other programs' names for a model's tensors in Largo's naming: the rename that
// checkpoint::WeightsInitOptions takes (MODEL.WEIGHTS_INIT) for a model built from
// ModelOptions. weights_name_mapping combines VISSL's head names (head_name_from_vissl,
// below) with the trunk's (resnet_name_from_torchvision, regnet_name_from_torchvision:
// torchvision's and VISSL's).
//
// VISSL's head names:
// VISSL keeps its heads in a ModuleList, one entry per MODEL.HEAD.PARAMS head, so its
// tensors are "heads.<i>.<name in head i>". Largo's model has one "head" Sequential:
//   - swav_head (one head, SwavHead keeps VISSL's module names): heads.0.<rest> -> head.0.<rest>
//     (heads.0.projection_head.0.weight -> head.0.projection_head.0.weight,
//      heads.0.prototypes0.weight -> head.0.prototypes0.weight);
//   - dino_head (one head, DinoHead keeps VISSL's module names) likewise
//     (heads.0.mlp.0.weight -> head.0.mlp.0.weight, heads.0.prototypes0.weight_v ->
//      head.0.prototypes0.weight_v);
//   - one mlp (or no MODEL.HEAD.PARAMS: the linear head, VISSL's mlp of dims [in, classes]):
//     heads.0.clf.<k>.<rest> -> head.<k>.<rest>;
//   - several mlp heads run one after another (SimCLR's and Barlow Twins' projections),
//     flattened into one Sequential: heads.<i>.clf.<k>.<rest> -> head.<o_i + k>.<rest>, o_i
//     the layers of heads 0..i-1 (mlp_head_layers: VISSL's MLP makes the same layers, and
//     head_chain_layers counts a normalisation too); a swav_head without prototypes first in
//     such a chain is heads.0.projection_head.<k>.<rest> -> head.<k>.<rest>.
// Linear evaluation's heads (eval_mlp, mlp per tapped feature) are "heads.<i>.clf..." and
// "heads.<i>.channel_bn..." in both: nothing to map. A name that is not a head's of the model
// `options` describes (a head index or layer beyond it, another head type's names) comes back
// unchanged, so the weights-init error names it as the file's tensor the model lacks.
#pragma once

#include <largo/models/model_factory.h>

#include <functional>
#include <string>

namespace largo::models {

std::string head_name_from_vissl(const std::string& name, const ModelOptions& options);

// The rename for a model built from `options`: a "heads." name through head_name_from_vissl,
// any other through the trunk's mapping (ResNet, RegNet; other trunks' names as they are).
std::function<std::string(const std::string&)> weights_name_mapping(const ModelOptions& options);

} // namespace largo::models
