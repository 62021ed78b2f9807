#include <largo/parallel/wrap_policy.h>

#include <largo/core/error.h>

#include <fmt/format.h>

namespace largo::parallel {
namespace {

void collect_targets(const std::shared_ptr<torch::nn::Module>& module, const std::string& prefix,
                     const WrapPolicy& policy, std::vector<WrapTarget>& targets) {
  auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module);
  const auto children = module->named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string name = prefix + children[i].key();
    const std::shared_ptr<torch::nn::Module>& child = children[i].value();
    if (sequential) {
      const int64_t numel = trainable_numel(*child);
      if (policy.matches(name, *child, numel)) {
        targets.push_back(WrapTarget{name, child, torch::nn::Sequential(sequential), i, numel});
        continue; // units do not nest
      }
    }
    collect_targets(child, name + ".", policy, targets);
  }
}

} // namespace

WrapPolicy::WrapPolicy(Predicate predicate, std::string description)
    : predicate_(std::move(predicate)), description_(std::move(description)) {}

WrapPolicy WrapPolicy::elements_of(const std::string& container_name) {
  const std::string prefix = container_name + ".";
  return WrapPolicy(
      [prefix](const std::string& name, const torch::nn::Module&, int64_t) {
        return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
            name.find('.', prefix.size()) == std::string::npos;
      },
      "the elements of " + container_name);
}

WrapPolicy WrapPolicy::min_trainable_parameters(int64_t min_numel) {
  if (min_numel < 0) {
    throw OptionError("WrapPolicy::min_trainable_parameters", std::to_string(min_numel),
                      "an integer >= 0 (0: every element that has trainable parameters)");
  }
  return WrapPolicy(
      [min_numel](const std::string&, const torch::nn::Module&, int64_t numel) {
        return numel > 0 && numel >= min_numel;
      },
      fmt::format("modules with >= {} trainable parameter elements", std::max<int64_t>(min_numel, 1)));
}

WrapPolicy operator&&(const WrapPolicy& a, const WrapPolicy& b) {
  if (a.empty() || b.empty()) {
    return WrapPolicy();
  }
  return WrapPolicy(
      [a, b](const std::string& name, const torch::nn::Module& module, int64_t numel) {
        return a.matches(name, module, numel) && b.matches(name, module, numel);
      },
      a.describe() + " that are " + b.describe());
}

bool WrapPolicy::matches(const std::string& name, const torch::nn::Module& module,
                         int64_t trainable_numel) const {
  return predicate_ && predicate_(name, module, trainable_numel);
}

std::vector<WrapTarget> find_wrap_targets(const std::shared_ptr<torch::nn::Module>& root,
                                          const WrapPolicy& policy) {
  std::vector<WrapTarget> targets;
  if (!policy.empty()) {
    collect_targets(root, "", policy, targets);
  }
  return targets;
}

int64_t trainable_numel(const torch::nn::Module& module) {
  int64_t numel = 0;
  for (const auto& param : module.parameters(/*recurse=*/true)) {
    if (param.requires_grad()) {
      numel += param.numel();
    }
  }
  return numel;
}

} // namespace largo::parallel
