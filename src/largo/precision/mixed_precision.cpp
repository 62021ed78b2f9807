#include <largo/precision/mixed_precision.h>

#include <largo/core/error.h>
#include <largo/precision/autocast.h>
#include <largo/precision/model_cast.h>

#include <ATen/core/Dict.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <limits>

namespace largo::precision {
namespace {

using c10::IValue;
using c10::impl::GenericDict;

GenericDict make_string_dict() {
  return GenericDict(c10::StringType::get(), c10::AnyType::get());
}

IValue entry_of(const GenericDict& dict, const char* key) {
  auto it = dict.find(IValue(std::string(key)));
  if (it == dict.end()) {
    throw CheckpointError(fmt::format(
        "the checkpoint's mixed-precision state has no '{}'; it was not written by Largo or is "
        "damaged",
        key));
  }
  return it->value();
}

} // namespace

MixedPrecision::MixedPrecision(PrecisionPolicy policy, torch::nn::Module& model,
                               c10::Device device, GradScalerOptions scaler_options,
                               bool check_finite_without_scaler)
    : policy_(std::move(policy)),
      device_(device),
      check_finite_without_scaler_(check_finite_without_scaler),
      reducer_(scaler_options.found_inf_reducer) {
  check_policy_supported_on(policy_, device_);
  if (policy_.cast_model) {
    ModelCastOptions cast;
    cast.dtype = policy_.low_precision;
    cast.keep_batchnorm_fp32 = policy_.keep_batchnorm_fp32;
    cast_model(model, cast);
  }
  if (policy_.master_weights) {
    masters_ = std::make_unique<MasterWeights>(model);
  }
  if (policy_.loss_scaling != LossScaling::kNone) {
    scaler_options.enabled = true;
    if (policy_.loss_scaling == LossScaling::kStatic) {
      scaler_options.dynamic = false;
      scaler_options.init_scale = policy_.static_loss_scale;
      scaler_options.min_loss_scale = 0.0;
      scaler_options.max_loss_scale = std::numeric_limits<double>::infinity();
    }
    scaler_ = std::make_unique<GradScaler>(std::move(scaler_options));
  }
}

MixedPrecision::~MixedPrecision() = default;

at::Tensor MixedPrecision::optimizer_param(const std::string& name,
                                           const at::Tensor& model_param) const {
  return masters_ ? masters_->master(name) : model_param;
}

at::Tensor MixedPrecision::forward(const std::function<at::Tensor(const at::Tensor&)>& forward,
                                   const at::Tensor& input) const {
  if (!policy_.enabled) {
    return forward(input);
  }
  at::Tensor x = input;
  if (policy_.cast_model && x.is_floating_point()) {
    x = x.to(policy_.low_precision);
  }
  at::Tensor output;
  if (policy_.autocast) {
    AutocastGuard autocast(device_.type(), policy_.low_precision);
    output = forward(x);
  } else {
    output = forward(x);
  }
  if (output.is_floating_point() && output.scalar_type() != at::kFloat) {
    output = output.to(at::kFloat);
  }
  return output;
}

void MixedPrecision::backward(const at::Tensor& loss) {
  (scaler_ ? scaler_->scale(loss) : loss).backward();
}

std::vector<at::Tensor>
MixedPrecision::gradients_to_check(const std::vector<at::Tensor>& optimizer_params) {
  if (masters_) {
    masters_->copy_grads_to_masters();
  }
  std::vector<at::Tensor> grads;
  grads.reserve(optimizer_params.size());
  for (const at::Tensor& param : optimizer_params) {
    grads.push_back(param.grad());
  }
  return grads;
}

bool MixedPrecision::unscale_(
    const std::vector<at::Tensor>& optimizer_params, bool loss_is_finite) {
  const std::vector<at::Tensor> grads = gradients_to_check(optimizer_params);
  if (scaler_) {
    scaler_->unscale_(grads, /*found_inf_elsewhere=*/!loss_is_finite);
    found_non_finite_ = scaler_->found_inf();
  } else if (check_finite_without_scaler_) {
    at::Tensor flag = non_finite_flag(grads);
    if (!loss_is_finite) {
      flag.fill_(1.0f);
    }
    if (reducer_) {
      reducer_(flag);
    }
    found_non_finite_ = flag.item<float>() != 0.0f;
  } else {
    found_non_finite_ = false;
  }
  return !found_non_finite_;
}

at::Tensor MixedPrecision::unscale_on_device(
    const std::vector<at::Tensor>& optimizer_params, const at::Tensor& loss_non_finite) {
  if (scaler_) {
    throw Error("MixedPrecision::unscale_on_device: with loss scaling the skip and the scale "
                "update are decided on the host each step; call unscale_");
  }
  const std::vector<at::Tensor> grads = gradients_to_check(optimizer_params);
  found_non_finite_ = false; // step() runs the optimizer; the caller reads the flag later
  if (!check_finite_without_scaler_) {
    return {};
  }
  at::Tensor flag = non_finite_flag(grads);
  if (loss_non_finite.defined()) { // either of them set
    flag = at::maximum(flag, loss_non_finite.to(flag.options()).reshape({1}));
  }
  if (reducer_) {
    reducer_(flag);
  }
  return flag;
}

bool MixedPrecision::step(const std::function<void()>& optimizer_step) {
  bool stepped = false;
  if (scaler_) {
    stepped = scaler_->step(optimizer_step);
  } else if (!found_non_finite_) {
    optimizer_step();
    stepped = true;
  }
  found_non_finite_ = false;
  if (!stepped) {
    ++skipped_steps_;
  }
  if (stepped && masters_) {
    masters_->copy_masters_to_model();
  }
  if (scaler_) {
    scaler_->update(); // last: it may throw when the scale cannot back off any further
  }
  return stepped;
}

void MixedPrecision::copy_model_to_masters() {
  if (masters_) {
    masters_->reset_from_model();
  }
}

double MixedPrecision::loss_scale() const {
  return scaler_ ? scaler_->get_scale() : 1.0;
}

c10::IValue MixedPrecision::state_dict() const {
  GenericDict state = make_string_dict();
  state.insert("policy", policy_.describe());
  state.insert("skipped_steps", skipped_steps_);
  state.insert("grad_scaler", scaler_ ? scaler_->state_dict() : IValue(make_string_dict()));
  state.insert("master_weights", masters_ ? masters_->state_dict() : make_string_dict());
  return state;
}

void MixedPrecision::load_state_dict(const c10::IValue& state) {
  if (state.isNone()) {
    if (scaler_) {
      spdlog::warn("the checkpoint has no loss-scale state (written without mixed precision); "
                   "the loss scale starts again at {}",
                   scaler_->get_scale());
    }
    if (masters_) {
      masters_->reset_from_model();
    }
    return;
  }
  if (!state.isGenericDict()) {
    throw CheckpointError(
        fmt::format("the checkpoint's mixed-precision state must be a dict, got {}",
                    state.tagKind()));
  }
  const GenericDict dict = state.toGenericDict();
  const IValue skipped = entry_of(dict, "skipped_steps");
  const IValue scaler_state = entry_of(dict, "grad_scaler");
  const IValue master_state = entry_of(dict, "master_weights");
  if (!skipped.isInt() || !scaler_state.isGenericDict() || !master_state.isGenericDict()) {
    throw CheckpointError("the checkpoint's mixed-precision state is malformed (skipped_steps "
                          "must be an int, grad_scaler and master_weights dicts)");
  }
  const GenericDict saved_scaler = scaler_state.toGenericDict();
  const GenericDict saved_masters = master_state.toGenericDict();
  if (masters_) {
    if (saved_masters.empty()) {
      spdlog::warn("the checkpoint has no float32 master weights; they start from the model's "
                   "{} weights",
                   c10::toString(policy_.low_precision));
      masters_->reset_from_model();
    } else {
      masters_->load_state_dict(saved_masters);
    }
  }
  if (scaler_) {
    if (saved_scaler.empty()) {
      spdlog::warn("the checkpoint has no loss-scale state; the loss scale starts again at {}",
                   scaler_->get_scale());
    } else {
      scaler_->load_state_dict(saved_scaler);
    }
  }
  skipped_steps_ = skipped.toInt();
}

} // namespace largo::precision
