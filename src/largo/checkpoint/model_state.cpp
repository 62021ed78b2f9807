#include <largo/checkpoint/model_state.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::checkpoint {
namespace {

std::vector<std::pair<std::string, at::Tensor>> named_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    tensors.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    tensors.emplace_back(item.key(), item.value());
  }
  return tensors;
}

} // namespace

StateDict model_state_dict(const torch::nn::Module& module) {
  StateDict state(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, tensor] : named_tensors(module)) {
    state.insert(name, tensor.detach());
  }
  return state;
}

void check_model_state_dict(
    const torch::nn::Module& module,
    const StateDict& state,
    bool exact_floating_dtypes,
    const std::string& source,
    const std::map<std::string, std::vector<int64_t>>& whole_shapes) {
  const auto tensors = named_tensors(module);
  std::vector<std::string> missing;
  std::vector<std::string> mismatched;
  for (const auto& [name, tensor] : tensors) {
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
      continue;
    }
    if (!it->value().isTensor()) {
      mismatched.push_back(fmt::format("{} (not a tensor)", name));
      continue;
    }
    const at::Tensor& saved = it->value().toTensor();
    const bool same_dtype = saved.scalar_type() == tensor.scalar_type() ||
        (!exact_floating_dtypes && saved.is_floating_point() && tensor.is_floating_point());
    const auto whole = whole_shapes.find(name);
    const at::IntArrayRef shape =
        whole != whole_shapes.end() ? at::IntArrayRef(whole->second) : tensor.sizes();
    if (saved.sizes() != shape || !same_dtype) {
      mismatched.push_back(fmt::format(
          "{} (checkpoint {} {}, model {} {})",
          name,
          c10::str(saved.sizes()),
          c10::toString(saved.scalar_type()),
          c10::str(shape),
          c10::toString(tensor.scalar_type())));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& entry : state) {
    if (!entry.key().isString()) {
      unexpected.push_back(fmt::format("(a key of type {})", entry.key().tagKind()));
      continue;
    }
    const std::string name = entry.key().toStringRef();
    bool known = std::any_of(tensors.begin(), tensors.end(),
                             [&](const auto& item) { return item.first == name; });
    if (!known) {
      unexpected.push_back(name);
    }
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    throw CheckpointError(fmt::format(
        "{}the checkpoint's model does not match this model (was it written with another "
        "MODEL config or class count?): missing [{}]; unexpected [{}]; mismatched [{}]",
        source.empty() ? "" : source + ": ", fmt::join(missing, ", "), fmt::join(unexpected, ", "),
        fmt::join(mismatched, ", ")));
  }
}

void load_model_state_dict(torch::nn::Module& module, const StateDict& state,
                           const std::string& source) {
  check_model_state_dict(module, state, /*exact_floating_dtypes=*/true, source);
  auto tensors = named_tensors(module);
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : tensors) {
    tensor.copy_(state.at(name).toTensor());
  }
}

} // namespace largo::checkpoint
