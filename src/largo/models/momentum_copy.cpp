#include <largo/models/momentum_copy.h>

#include <largo/core/error.h>

#include <fmt/format.h>

namespace largo::models {
namespace {

at::Tensor cpu_copy(const at::Tensor& tensor) {
  return tensor.is_cpu() ? tensor.detach().clone() : tensor.detach().cpu();
}

void load_entry(
    const std::map<std::string, at::Tensor>& state,
    const std::string& name,
    at::Tensor& target,
    const std::string& what) {
  const auto it = state.find(name);
  if (it == state.end() || it->second.sizes() != target.sizes()) {
    throw CheckpointError(fmt::format(
        "{} state: {} {}; the model must be that of the run that saved it",
        what,
        name,
        it == state.end() ? std::string("is missing") : std::string("has another shape")));
  }
  target.copy_(it->second);
}

} // namespace

void freeze_as_copy_of(
    const torch::nn::Module& model, torch::nn::Module& copy, const std::string& mismatch) {
  const auto model_parameters = model.named_parameters();
  const auto copy_parameters = copy.named_parameters();
  bool same = model_parameters.size() == copy_parameters.size();
  for (const auto& item : model_parameters) {
    const at::Tensor* other = copy_parameters.find(item.key());
    same = same && other != nullptr && other->sizes() == item.value().sizes();
  }
  if (!same) {
    throw ConfigError(mismatch);
  }
  for (auto& parameter : copy.parameters()) {
    parameter.requires_grad_(false);
  }
}

std::vector<at::Tensor> momentum_copy_sources(
    const torch::nn::Module& model,
    const torch::nn::Module& copy,
    const WholeParameters* whole,
    const std::string& what) {
  std::map<std::string, at::Tensor> by_name;
  if (whole != nullptr) {
    by_name.insert(whole->begin(), whole->end());
  } else {
    for (const auto& item : model.named_parameters()) {
      // FSDP frees a unit's storage in place between its uses: the shape stays, the bytes go.
      const at::Tensor& value = item.value();
      if (value.numel() > 0 && value.storage().nbytes() == 0) {
        throw Error(fmt::format(
            "{}: the model's parameter {} has no memory behind it (sharded by FSDP); build or "
            "update the copy from the gathered whole values (ParallelModel::full_parameters())",
            what,
            item.key()));
      }
      by_name.emplace(item.key(), value);
    }
  }
  std::vector<at::Tensor> sources;
  for (const auto& item : copy.named_parameters()) {
    const auto found = by_name.find(item.key());
    if (found == by_name.end()) {
      throw Error(fmt::format(
          "{}: no value for the parameter {}; the copy must be of the model's architecture",
          what,
          item.key()));
    }
    sources.push_back(found->second);
  }
  return sources;
}

std::map<std::string, at::Tensor>
momentum_copy_state_dict(const torch::nn::Module& copy, const std::string& prefix) {
  std::map<std::string, at::Tensor> state;
  for (const auto& item : copy.named_parameters()) {
    state.emplace(prefix + item.key(), cpu_copy(item.value()));
  }
  for (const auto& item : copy.named_buffers()) {
    state.emplace(prefix + item.key(), cpu_copy(item.value()));
  }
  return state;
}

void load_momentum_copy_state_dict(
    torch::nn::Module& copy,
    const std::map<std::string, at::Tensor>& state,
    const std::string& prefix,
    const std::string& what) {
  at::NoGradGuard no_grad;
  for (auto& item : copy.named_parameters()) {
    load_entry(state, prefix + item.key(), item.value(), what);
  }
  for (auto& item : copy.named_buffers()) {
    load_entry(state, prefix + item.key(), item.value(), what);
  }
}

int64_t load_momentum_copy_counter(
    const std::map<std::string, at::Tensor>& state,
    const std::string& name,
    const std::string& what) {
  at::Tensor counter = at::zeros({1}, at::kLong);
  load_entry(state, name, counter, what);
  return counter.item<int64_t>();
}

} // namespace largo::models
