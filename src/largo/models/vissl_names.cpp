#include <largo/models/vissl_names.h>

#include <cstdio>
#include <vector>

namespace largo::models {
namespace {

// "heads.<i>.<rest>" -> (i, rest); false for any other name.
bool split_head_name(const std::string& name, int64_t& head, std::string& rest) {
  long long index = 0;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "heads.%lld.%n", &index, &consumed) != 1 || consumed == 0 ||
      index < 0) {
    return false;
  }
  head = index;
  rest = name.substr(static_cast<size_t>(consumed));
  return true;
}

// "<module>.<k>.<rest>" -> (k, rest), k < num_layers; false otherwise.
bool split_layer_name(
    const std::string& name,
    const std::string& module,
    int64_t num_layers,
    int64_t& layer,
    std::string& rest) {
  long long index = 0;
  int consumed = 0;
  if (name.rfind(module + ".", 0) != 0 ||
      std::sscanf(name.c_str() + module.size(), ".%lld.%n", &index, &consumed) != 1 ||
      consumed == 0 || index < 0 || index >= num_layers) {
    return false;
  }
  consumed += static_cast<int>(module.size());
  layer = index;
  rest = name.substr(static_cast<size_t>(consumed));
  return true;
}

// The mlp heads of the model `options` describes, one after another: their dims and switches.
std::vector<MlpHeadSpec> mlp_heads(const ModelOptions& options) {
  if (!options.head_chain.empty()) {
    return options.head_chain;
  }
  if (!options.head_dims.empty()) {
    return {MlpHeadSpec{options.head_dims, options.head}};
  }
  return {MlpHeadSpec{{0, options.num_classes}, MlpHeadOptions{}}}; // the linear head
}

} // namespace

std::string head_name_from_vissl(const std::string& name, const ModelOptions& options) {
  int64_t head = 0;
  std::string rest;
  if (!split_head_name(name, head, rest)) {
    return name;
  }
  if (!options.swav_head.dims.empty() || options.dino_head.in_dim > 0 ||
      options.head_channel_bn > 0) {
    return head == 0 ? "head.0." + rest : name; // one head with VISSL's module names
  }
  if (!options.feature_eval.taps.empty()) {
    return name; // linear evaluation: VISSL's names already
  }
  const std::vector<MlpHeadSpec> heads = mlp_heads(options);
  if (head >= static_cast<int64_t>(heads.size())) {
    return name;
  }
  int64_t offset = 0;
  for (int64_t i = 0; i < head; ++i) {
    offset += static_cast<int64_t>(head_chain_layers(heads[i]));
  }
  const auto& spec = heads[static_cast<size_t>(head)];
  const auto num_layers =
      static_cast<int64_t>(mlp_head_layers(spec.dims.size(), spec.options).size());
  int64_t layer = 0;
  std::string tensor;
  if (!split_layer_name(rest, spec.vissl_module, num_layers, layer, tensor)) {
    return name;
  }
  return "head." + std::to_string(offset + layer) + "." + tensor;
}

std::function<std::string(const std::string&)> weights_name_mapping(const ModelOptions& options) {
  return [options](const std::string& name) {
    if (name.rfind("heads.", 0) == 0) {
      return head_name_from_vissl(name, options);
    }
    if (options.trunk_name == "resnet") {
      return resnet_name_from_torchvision(name, options.resnet.depth);
    }
    if (options.trunk_name == "resnet_sk") {
      return resnet_sk_name_from_vissl(name, options.resnet_sk);
    }
    if (options.trunk_name == "regnet") {
      return regnet_name_from_torchvision(name, options.regnet);
    }
    return name;
  };
}

} // namespace largo::models
