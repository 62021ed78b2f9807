#include <largo/optim/param_groups.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>

#include <unordered_set>
#include <utility>

namespace largo::optim {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// The parameters to optimize in named_parameters() order, each once (modules may share one),
// those with requires_grad = false left out.
std::vector<std::pair<std::string, at::Tensor>> trained_parameters(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> trained;
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad() && seen.insert(item.value().unsafeGetTensorImpl()).second) {
      trained.emplace_back(item.key(), item.value());
    }
  }
  return trained;
}

// VISSL's get_dino_optimizer_param_groups: biases and anything named "norm" are not decayed.
std::vector<ParamGroup>
build_dino_param_groups(const torch::nn::Module& model, const ParamGroupOptions& options) {
  std::vector<ParamGroup> groups(2);
  groups[0].name = "decayed";
  groups[0].weight_decay = options.weight_decay;
  groups[1].name = "not_decayed";
  for (auto& [name, param] : trained_parameters(model)) {
    const bool decayed = !ends_with(name, ".bias") && name.find("norm") == std::string::npos;
    ParamGroup& group = groups[decayed ? 0 : 1];
    group.params.push_back(param);
    group.names.push_back(name);
  }
  std::vector<ParamGroup> non_empty;
  for (ParamGroup& group : groups) {
    group.lr = options.lr;
    if (!group.params.empty()) {
      non_empty.push_back(std::move(group));
    }
  }
  return non_empty;
}

// VISSL's construct_single_param_group_only: model.parameters() in one group, all decayed.
std::vector<ParamGroup>
build_single_param_group(const torch::nn::Module& model, const ParamGroupOptions& options) {
  ParamGroup group;
  group.name = "all";
  group.lr = options.lr;
  group.weight_decay = options.weight_decay;
  for (auto& [name, param] : trained_parameters(model)) {
    group.params.push_back(param);
    group.names.push_back(name);
  }
  if (group.params.empty()) {
    return {};
  }
  return {std::move(group)};
}

} // namespace

DecaySource decay_source(const std::string& group_name) {
  if (group_name == "trunk" || group_name == "decayed" || group_name == "all") {
    return DecaySource::kWeightDecay;
  }
  return group_name == "head" ? DecaySource::kHeadWeightDecay : DecaySource::kNone;
}

bool is_norm_layer(const torch::nn::Module& module) {
  namespace nn = torch::nn;
  return dynamic_cast<const nn::BatchNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const nn::BatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const nn::BatchNorm3dImpl*>(&module) != nullptr ||
         dynamic_cast<const nn::InstanceNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const nn::InstanceNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const nn::InstanceNorm3dImpl*>(&module) != nullptr ||
         dynamic_cast<const nn::LayerNormImpl*>(&module) != nullptr ||
         dynamic_cast<const nn::GroupNormImpl*>(&module) != nullptr;
}

std::vector<ParamGroup>
build_param_groups(const torch::nn::Module& model, const ParamGroupOptions& options) {
  if (options.rule == ParamGroupRule::kDino) {
    return build_dino_param_groups(model, options);
  }
  if (options.rule == ParamGroupRule::kSingle) {
    return build_single_param_group(model, options);
  }
  const double head_weight_decay =
      options.use_different_wd ? options.head_weight_decay : options.weight_decay;
  // Indexed as listed in the header: trunk, trunk_no_wd, head, head_no_wd.
  std::vector<ParamGroup> groups(4);
  groups[0].name = "trunk";
  groups[0].weight_decay = options.weight_decay;
  groups[1].name = "trunk_no_wd";
  groups[2].name = "head";
  groups[2].weight_decay = head_weight_decay;
  groups[3].name = "head_no_wd";
  for (ParamGroup& group : groups) {
    group.lr = options.lr;
  }

  std::unordered_set<const void*> seen; // TensorImpl of parameters already placed
  auto place = [&](const torch::nn::Module& module, const std::string& module_name) {
    const bool in_norm_layer =
        options.is_norm_layer ? options.is_norm_layer(module) : is_norm_layer(module);
    for (const auto& item : module.named_parameters(/*recurse=*/false)) {
      const at::Tensor& param = item.value();
      if (!param.requires_grad() || !seen.insert(param.unsafeGetTensorImpl()).second) {
        continue;
      }
      const std::string name = module_name.empty() ? item.key() : module_name + "." + item.key();
      bool decayed = true;
      if (in_norm_layer && !options.regularize_bn) {
        decayed = false;
      }
      if (ends_with(name, "bias") && !options.regularize_bias) {
        decayed = false;
      }
      for (const std::string& pattern : options.non_regularized_parameters) {
        if (name.find(pattern) != std::string::npos) {
          decayed = false;
        }
      }
      const bool in_head = starts_with(name, options.head_prefix);
      ParamGroup& group = groups[(in_head ? 2 : 0) + (decayed ? 0 : 1)];
      group.params.push_back(param);
      group.names.push_back(name);
    }
  };

  // The root's own parameters first, then every submodule in named_parameters() order.
  // (include_self = false: the root need not be held by a shared_ptr.)
  place(model, "");
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    place(*item.value(), item.key());
  }

  std::vector<ParamGroup> non_empty;
  for (ParamGroup& group : groups) {
    if (!group.params.empty()) {
      non_empty.push_back(std::move(group));
    }
  }
  return non_empty;
}

std::vector<std::string> bias_and_norm_parameter_names(
    const torch::nn::Module& model,
    const std::function<bool(const torch::nn::Module&)>& is_norm) {
  std::vector<std::string> names;
  std::unordered_set<const void*> seen;
  auto visit = [&](const torch::nn::Module& module, const std::string& module_name) {
    const bool in_norm_layer = is_norm ? is_norm(module) : is_norm_layer(module);
    for (const auto& item : module.named_parameters(/*recurse=*/false)) {
      if (!item.value().requires_grad() ||
          !seen.insert(item.value().unsafeGetTensorImpl()).second) {
        continue;
      }
      const std::string name = module_name.empty() ? item.key() : module_name + "." + item.key();
      if (in_norm_layer || ends_with(name, "bias")) {
        names.push_back(name);
      }
    }
  };
  visit(model, "");
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    visit(*item.value(), item.key());
  }
  return names;
}

std::vector<std::string> one_dimensional_parameter_names(const torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad() && item.value().dim() == 1) {
      names.push_back(item.key());
    }
  }
  return names;
}

} // namespace largo::optim
