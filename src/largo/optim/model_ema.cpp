#include <largo/optim/model_ema.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>

#include <vector>

namespace largo::optim {
namespace {

// Floating averages are at least float32 (VISSL's EMA model is a float32 model).
at::ScalarType average_dtype(const at::Tensor& tensor) {
  if (!tensor.is_floating_point()) {
    return tensor.scalar_type();
  }
  return tensor.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

} // namespace

void validate_model_ema_options(const ModelEmaOptions& options) {
  const std::string key = "ModelEmaOptions::";
  if (!(options.decay >= 0.0 && options.decay <= 1.0)) {
    throw OptionError(key + "decay", fmt::format("{}", options.decay), "a number in [0, 1]");
  }
  if (options.update_iter < 1) {
    throw OptionError(key + "update_iter", std::to_string(options.update_iter), "an integer >= 1");
  }
  if (!(options.warmup >= 0.0 && options.warmup <= 1.0)) {
    throw OptionError(
        key + "warmup", fmt::format("{}", options.warmup), "a fraction of training in [0, 1]");
  }
}

ModelEma::ModelEma(const NamedTensors& tensors, ModelEmaOptions options) : options_(options) {
  validate_model_ema_options(options_);
  torch::NoGradGuard no_grad;
  for (const auto& item : tensors) {
    const at::Tensor& value = item.value();
    averages_.insert(
        item.key(),
        value.detach().to(
            options_.device.value_or(value.device()),
            average_dtype(value),
            /*non_blocking=*/false,
            /*copy=*/true));
  }
}

bool ModelEma::on_update(const NamedTensors& tensors, int64_t iteration, double where) {
  if (iteration % options_.update_iter != 0) {
    return false;
  }
  if (where < options_.warmup) {
    set(tensors);
  } else {
    update(tensors);
  }
  return true;
}

void ModelEma::update(const NamedTensors& tensors) {
  check_matches(tensors, "update");
  torch::NoGradGuard no_grad;
  const double decay = options_.decay;
  for (const auto& item : tensors) {
    at::Tensor& average = averages_[item.key()];
    const at::Tensor value = item.value().detach().to(average.device());
    if (!average.is_floating_point()) {
      average.copy_(value);
      continue;
    }
    // VISSL's expression, evaluated with the same type promotion: decay * e + (1 - decay) * m
    // (for a bfloat16 m, (1 - decay) * m is rounded to bfloat16 before the sum, as there).
    average.copy_(average.mul(decay).add(value.mul(1.0 - decay)));
  }
}

void ModelEma::set(const NamedTensors& tensors) {
  check_matches(tensors, "set");
  torch::NoGradGuard no_grad;
  for (const auto& item : tensors) {
    averages_[item.key()].copy_(item.value().detach());
  }
}

void ModelEma::copy_to(const NamedTensors& targets) const {
  check_matches(targets, "copy_to");
  torch::NoGradGuard no_grad;
  for (const auto& item : targets) {
    at::Tensor target = item.value();
    target.copy_(averages_[item.key()]);
  }
}

void ModelEma::check_matches(const NamedTensors& tensors, const std::string& what) const {
  std::vector<std::string> problems;
  for (const auto& item : tensors) {
    const at::Tensor* average = averages_.find(item.key());
    if (average == nullptr) {
      problems.push_back(fmt::format("{} (not in the average)", item.key()));
    } else if (average->sizes() != item.value().sizes()) {
      problems.push_back(fmt::format(
          "{} (shape [{}], the average's [{}])",
          item.key(),
          fmt::join(item.value().sizes(), ", "),
          fmt::join(average->sizes(), ", ")));
    }
  }
  for (const auto& item : averages_) {
    if (tensors.find(item.key()) == nullptr) {
      problems.push_back(fmt::format("{} (missing)", item.key()));
    }
  }
  if (!problems.empty()) {
    throw Error(fmt::format(
        "ModelEma::{}: the tensors do not match the average's: {}",
        what,
        fmt::join(problems, "; ")));
  }
}

c10::IValue ModelEma::state_dict() const {
  c10::impl::GenericDict averages(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : averages_) {
    // A checkpoint any machine reads, in the standard layout (a channels-last model's too).
    averages.insert(item.key(), item.value().to(at::kCPU).contiguous());
  }
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("decay", options_.decay);
  state.insert("update_iter", options_.update_iter);
  state.insert("warmup", options_.warmup);
  state.insert("averages", averages);
  return state;
}

void ModelEma::load_state_dict(const c10::IValue& state) {
  if (!state.isGenericDict() || !state.toGenericDict().contains("averages") ||
      !state.toGenericDict().at("averages").isGenericDict()) {
    throw CheckpointError(
        "EMA state: expected a dict with an \"averages\" dict (ModelEma::state_dict())");
  }
  NamedTensors loaded;
  for (const auto& entry : state.toGenericDict().at("averages").toGenericDict()) {
    if (!entry.value().isTensor()) {
      throw CheckpointError(
          fmt::format("EMA state: averages[{}] is not a tensor", entry.key().toStringRef()));
    }
    loaded.insert(entry.key().toStringRef(), entry.value().toTensor());
  }
  try {
    check_matches(loaded, "load_state_dict");
  } catch (const Error& error) {
    throw CheckpointError(error.what());
  }
  torch::NoGradGuard no_grad;
  for (const auto& item : loaded) {
    averages_[item.key()].copy_(item.value());
  }
}

AverageInModel::AverageInModel(const ModelEma& ema, NamedTensors model_tensors)
    : model_tensors_(std::move(model_tensors)) {
  for (const auto& item : model_tensors_) {
    own_values_.push_back(item.value().detach().clone());
  }
  ema.copy_to(model_tensors_);
}

AverageInModel::~AverageInModel() {
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (const auto& item : model_tensors_) {
    at::Tensor target = item.value();
    target.copy_(own_values_[i++]);
  }
}

} // namespace largo::optim
