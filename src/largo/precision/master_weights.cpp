#include <largo/precision/master_weights.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <unordered_set>

namespace largo::precision {

MasterWeights::MasterWeights(const torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& param = item.value();
    if (!param.requires_grad()) {
      continue;
    }
    if (!param.is_floating_point()) {
      throw Error(fmt::format("parameter '{}' has dtype {}; master weights need floating-point "
                              "parameters",
                              item.key(), c10::toString(param.scalar_type())));
    }
    const bool copy = param.scalar_type() != at::kFloat;
    names_.push_back(item.key());
    model_params_.push_back(param);
    masters_.push_back(copy ? param.detach().to(at::kFloat).requires_grad_(true) : param);
    is_copy_.push_back(copy);
  }
}

const at::Tensor& MasterWeights::master(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) {
      return masters_[i];
    }
  }
  throw Error(fmt::format("no master weight for '{}': it is not a trainable parameter of the "
                          "model the master weights were made from",
                          name));
}

void MasterWeights::copy_grads_to_masters() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (!is_copy_[i]) {
      continue;
    }
    at::Tensor& model_grad = model_params_[i].mutable_grad();
    at::Tensor& master_grad = masters_[i].mutable_grad();
    if (!model_grad.defined()) {
      master_grad.reset();
      continue;
    }
    if (master_grad.defined()) {
      master_grad.copy_(model_grad);
    } else {
      master_grad = model_grad.to(at::kFloat);
    }
    model_grad.reset();
  }
}

void MasterWeights::copy_masters_to_model() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (is_copy_[i]) {
      model_params_[i].copy_(masters_[i]);
    }
  }
}

void MasterWeights::reset_from_model() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (is_copy_[i]) {
      masters_[i].copy_(model_params_[i]);
    }
  }
}

int64_t MasterWeights::copy_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (is_copy_[i]) {
      bytes += static_cast<int64_t>(masters_[i].numel() * masters_[i].element_size());
    }
  }
  return bytes;
}

c10::impl::GenericDict MasterWeights::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (is_copy_[i]) {
      state.insert(names_[i], masters_[i].detach());
    }
  }
  return state;
}

void MasterWeights::load_state_dict(const c10::impl::GenericDict& state) {
  std::unordered_set<std::string> expected;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (is_copy_[i]) {
      expected.insert(names_[i]);
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& entry : state) {
    const std::string name = entry.key().isString() ? entry.key().toStringRef() : "?";
    if (expected.count(name) == 0) {
      unexpected.push_back(name);
    }
  }
  std::vector<std::string> missing;
  std::vector<std::string> mismatched;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (!is_copy_[i]) {
      continue;
    }
    auto it = state.find(names_[i]);
    if (it == state.end()) {
      missing.push_back(names_[i]);
    } else if (!it->value().isTensor() || it->value().toTensor().sizes() != masters_[i].sizes()) {
      mismatched.push_back(names_[i]);
    }
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    throw CheckpointError(fmt::format(
        "the checkpoint's float32 master weights do not match this model (missing: [{}]; "
        "unexpected: [{}]; wrong shape: [{}]); it was written with a different model or "
        "ParallelOptions::precision setting (keep_batchnorm_fp32, opt_level)",
        fmt::join(missing, ", "),
        fmt::join(unexpected, ", "),
        fmt::join(mismatched, ", ")));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (is_copy_[i]) {
      masters_[i].copy_(state.at(names_[i]).toTensor());
    }
  }
  copy_masters_to_model();
}

} // namespace largo::precision
