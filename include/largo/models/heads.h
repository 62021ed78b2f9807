// Heads: what turns the trunk's features [batch, dim] into the model's output.
// The default is one Linear layer to the classes; VISSL's "mlp" head (MODEL.HEAD.PARAMS
// [["mlp", {"dims": [in, ..., out], ...}]]) is a stack of Linear layers with optional
// BatchNorm / ReLU / Dropout between them.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::models {

// Linear(in_features -> num_classes), initialized like torch.nn.Linear.
torch::nn::Sequential build_linear_head(int64_t in_features, int64_t num_classes);

// VISSL's mlp head switches (all but `dims`, which build_mlp_head takes separately).
struct MlpHeadOptions {
  bool use_bn = false;      // BatchNorm1d after each Linear
  bool use_relu = false;    // ReLU after each Linear (after the BatchNorm)
  bool use_dropout = false; // Dropout(0.5) after each Linear (after the ReLU)
  bool use_bias = true;     // bias in the Linear layers
  // Like VISSL: the last Linear is followed by nothing, so the head ends in raw scores.
  bool skip_last_layer_relu_bn = true;
  double batchnorm_eps = 1e-5;     // MODEL.HEAD.BATCHNORM_EPS
  double batchnorm_momentum = 0.1; // MODEL.HEAD.BATCHNORM_MOMENTUM
};

// Linear(dims[0] -> dims[1]) [-> BN -> ReLU -> Dropout] ... -> Linear(-> dims.back()).
// Module names follow VISSL's flat layout ("0", "1", ... in order of creation). Throws
// OptionError naming MlpHeadSpec::dims unless there are >= 2 dims, all > 0.
torch::nn::Sequential
build_mlp_head(const std::vector<int64_t>& dims, const MlpHeadOptions& options = {});

// The layers build_mlp_head makes for `num_dims` dims, in order: Linear, then (unless it is
// the last Linear and skip_last_layer_relu_bn) BatchNorm1d, ReLU, Dropout as switched on.
// VISSL's MLP makes the same list (vissl/models/heads/mlp.py), so index k here is its clf.<k>.
enum class MlpLayer { kLinear, kBatchNorm, kReLU, kDropout };
std::vector<MlpLayer> mlp_head_layers(size_t num_dims, const MlpHeadOptions& options);

// One of several mlp heads applied one after another (VISSL's SimCLR projection:
// [["mlp", {"dims": [2048, 2048], "use_relu": True, ...}], ["mlp", {"dims": [2048, 128]}]]),
// or a swav_head without prototypes used as the projection before a classifier (VISSL's
// fine-tuning of a SwAV checkpoint: [["swav_head", {"dims": [3024, 4096], "use_bn": True,
// "num_clusters": []}], ["mlp", {"dims": [4096, 1000]}]]): its projection is an mlp's layers
// (Linear, BatchNorm1d, ReLU, the last Linear bare unless skip_last_bn is False), then the
// L2 normalisation of normalize_feats.
struct MlpHeadSpec {
  std::vector<int64_t> dims;
  MlpHeadOptions options;
  // L2-normalise the head's output along dim 1 (a swav_head's normalize_feats): one
  // parameter-free layer after the head's own.
  bool normalize_output = false;
  // What VISSL calls the head's layers, heads.<i>.<vissl_module>.<k>: "clf" in an mlp,
  // "projection_head" in a swav_head.
  std::string vissl_module = "clf";
};

// The layers build_head_chain makes for `head`: mlp_head_layers' and the normalisation's.
size_t head_chain_layers(const MlpHeadSpec& head);

// The heads' layers in order, in one flat Sequential (a libtorch Sequential cannot hold a
// Sequential), so the names run on: VISSL's heads.1.0 of a [2048, 2048] head with ReLU is
// head.2 here. Throws
// OptionError naming ModelOptions::head_chain[i].dims when a head's first dim is not the previous
// output's width (`in_features` for the first).
torch::nn::Sequential build_head_chain(int64_t in_features, const std::vector<MlpHeadSpec>& heads);

} // namespace largo::models
