#include <largo/models/module_swap.h>

#include <largo/core/error.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/container/sequential.h>

#include <optional>
#include <utility>
#include <vector>

namespace largo::models {
namespace {

std::string child_path(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

std::string type_name(const torch::nn::Module& module) {
  return module.name(); // the C++ type name libtorch demangles
}

// The replacement of `module` (nullopt: kept, possibly with children swapped in place).
std::optional<SwappedModule> visit(
    const std::string& path,
    const std::shared_ptr<torch::nn::Module>& module,
    const ModuleReplacer& replace) {
  torch::nn::AnyModule replacement = replace(path, *module);
  if (!replacement.is_empty()) {
    return SwappedModule{std::move(replacement)};
  }
  std::vector<std::pair<std::string, SwappedModule>> swapped;
  for (const auto& child : module->named_children()) {
    auto child_replacement = visit(child_path(path, child.key()), child.value(), replace);
    if (child_replacement) {
      swapped.emplace_back(child.key(), std::move(*child_replacement));
    }
  }
  if (swapped.empty()) {
    return std::nullopt;
  }
  if (auto* sequential = module->as<torch::nn::SequentialImpl>()) {
    // A Sequential runs its own list of AnyModules: rebuild it with the same names. (Its
    // elements are AnyModules, so none of them is a Sequential.)
    torch::nn::Sequential rebuilt;
    const auto names = sequential->named_children().keys();
    size_t index = 0;
    for (auto element = sequential->begin(); element != sequential->end(); ++element, ++index) {
      torch::nn::AnyModule entry = *element;
      for (const auto& [name, new_module] : swapped) {
        if (name == names[index]) {
          entry = new_module.any;
        }
      }
      rebuilt->push_back(names[index], entry);
    }
    rebuilt->train(sequential->is_training());
    SwappedModule result;
    result.sequential = rebuilt;
    return result;
  }
  auto* parent = dynamic_cast<SwappableChildren*>(module.get());
  if (parent == nullptr) {
    throw Error(fmt::format(
        "cannot swap the module at {}: its parent {} ({}) calls it through a typed member; "
        "build the model with the replacement directly, or implement "
        "largo::models::SwappableChildren in that parent (include/largo/models/module_swap.h)",
        child_path(path, swapped.front().first),
        path.empty() ? "(the root)" : path,
        type_name(*module)));
  }
  for (const auto& [name, new_module] : swapped) {
    parent->swap_child(name, new_module);
  }
  return std::nullopt;
}

} // namespace

void swap_sequential_member(
    torch::nn::Module& parent,
    const std::string& name,
    const SwappedModule& replacement,
    std::initializer_list<std::pair<std::string_view, torch::nn::Sequential*>> members) {
  std::vector<std::string_view> names;
  for (const auto& [member_name, member] : members) {
    if (member_name == name && replacement.sequential) {
      parent.replace_module(name, replacement.sequential.ptr());
      *member = replacement.sequential;
      return;
    }
    names.push_back(member_name);
  }
  throw Error(fmt::format(
      "{} can only swap its {} for a Sequential, not {} for a {}",
      type_name(parent),
      fmt::join(names, " or "),
      name,
      type_name(*replacement.module())));
}

std::shared_ptr<torch::nn::Module>
swap_modules(const std::shared_ptr<torch::nn::Module>& root, const ModuleReplacer& replace) {
  auto replacement = visit("", root, replace);
  return replacement ? replacement->module() : root;
}

at::Tensor direct_tensor(const torch::nn::Module& module, const std::string& name) {
  const auto parameters = module.named_parameters(/*recurse=*/false);
  if (const at::Tensor* parameter = parameters.find(name)) {
    return *parameter;
  }
  const auto buffers = module.named_buffers(/*recurse=*/false);
  if (const at::Tensor* buffer = buffers.find(name)) {
    return *buffer;
  }
  return {};
}

} // namespace largo::models
