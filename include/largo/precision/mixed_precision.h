// A precision policy applied to one model: the few calls a training loop makes to run in
// mixed precision (Apex O0-O3 or PyTorch autocast + GradScaler, float16 or bfloat16).
//
//   MixedPrecision precision(policy, *model, device, scaler_options);   // casts the model (O2/O3)
//   for each group: params[i] = precision.optimizer_param(names[i], params[i]);  // O2: masters
//   per step:
//     optimizer.zero_grad();
//     logits = precision.forward([&](const at::Tensor& x) { return model->forward(x); }, images);
//     loss = criterion(logits, labels);                  // logits are float32
//     precision.backward(loss);                          // scaler.scale(loss).backward()
//     bool finite = precision.unscale_(optimizer_params); // O2: grads to masters; unscale; check
//     if (finite) clip(optimizer_params);                 // clipping / LARC see unscaled grads
//     bool stepped = precision.step([&] { optimizer.step(); });  // skipped on inf/NaN; update;
//                                                                // O2: masters copied down
// With loss scaling, a step with inf/NaN gradients is skipped and counted (skipped_steps());
// without it (float32, bfloat16) there is nothing to adapt, so unscale_ returning false means
// the run has diverged and the caller should stop (the trainer does, naming the iteration).
//
// Collective: unscale_ all-reduces found_inf (max) through scaler_options.found_inf_reducer
// when one is set, so every rank skips (or stops) together; call it on every rank every step
// (also when this rank's loss was inf/NaN: pass loss_is_finite = false rather than stopping
// alone, which would leave the other ranks waiting in a collective).
#pragma once

#include <largo/precision/grad_scaler.h>
#include <largo/precision/master_weights.h>
#include <largo/precision/precision_policy.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace largo::precision {

class MixedPrecision {
 public:
  // `model` must already be on `device`. Checks that the device can run the policy
  // (check_policy_supported_on), casts the model (O2/O3), makes master weights (O2) and a
  // GradScaler when the policy scales the loss (scaler_options' init_scale is replaced by
  // the policy's static scale for LossScaling::kStatic). check_finite_without_scaler: look for
  // inf/NaN gradients in runs without loss scaling too (HOOKS.CHECK_NAN).
  MixedPrecision(PrecisionPolicy policy, torch::nn::Module& model, c10::Device device,
                 GradScalerOptions scaler_options = {}, bool check_finite_without_scaler = true);
  ~MixedPrecision();
  MixedPrecision(const MixedPrecision&) = delete;
  MixedPrecision& operator=(const MixedPrecision&) = delete;

  const PrecisionPolicy& policy() const {
    return policy_;
  }

  // The tensor the optimizer updates for the model parameter `name`: its float32 master
  // with master weights, else `model_param` itself.
  at::Tensor optimizer_param(const std::string& name, const at::Tensor& model_param) const;

  // Runs `forward` on `input` as the policy says: under autocast (O1 / pytorch), or with the
  // input cast to the model's dtype (O2/O3). Floating-point outputs come back as float32 (so
  // the loss is computed in float32, as Apex does). Integer inputs are never cast.
  at::Tensor forward(const std::function<at::Tensor(const at::Tensor&)>& forward,
                     const at::Tensor& input) const;

  // scale(loss).backward() (just backward without loss scaling).
  void backward(const at::Tensor& loss);

  // After backward, with the optimizer's parameters (the masters under O2): copies the
  // gradients up to the masters (O2), unscales them and checks them for inf/NaN (collective
  // when a reducer is set). loss_is_finite = false (this rank's loss was inf/NaN) counts as
  // an inf gradient. Returns whether everything was finite on every rank.
  bool unscale_(const std::vector<at::Tensor>& optimizer_params, bool loss_is_finite = true);

  // unscale_ without reading its decision to the host, for runs without loss scaling (throws
  // largo::Error with a scaler, whose skip and scale update are decided on the host): copies
  // the gradients up to the masters (O2) and returns the inf/NaN flag, [1] float32 on the
  // gradients' device, 1 when a gradient was inf/NaN or `loss_non_finite` ([1] float32, 1:
  // this rank's loss was; undefined: no loss to check) was 1, on any rank (the reducer's
  // collective, on the device's stream). Undefined when the policy checks nothing
  // (check_finite_without_scaler false). The next step() runs the optimizer: the caller reads the
  // flag later (the trainer stops the run at that read when it is set).
  at::Tensor unscale_on_device(
      const std::vector<at::Tensor>& optimizer_params, const at::Tensor& loss_non_finite = {});

  // Runs optimizer_step unless unscale_ found inf/NaN, updates the loss scale and copies the
  // masters into the model (O2). Returns whether the optimizer stepped. Throws TrainingError
  // when the loss scale cannot back off any further (see GradScaler::update).
  bool step(const std::function<void()>& optimizer_step);

  // Whether a step with inf/NaN gradients is skipped (loss scaling on) rather than fatal.
  bool has_loss_scaling() const {
    return scaler_ != nullptr;
  }
  // The current loss scale (1 without loss scaling).
  double loss_scale() const;
  // Optimizer steps skipped for inf/NaN gradients since the run started (kept across resume).
  int64_t skipped_steps() const {
    return skipped_steps_;
  }
  const MasterWeights* master_weights() const {
    return masters_.get();
  }
  GradScaler* grad_scaler() {
    return scaler_.get();
  }

  // Sets the float32 masters from the model's weights (O2; nothing otherwise). For weights
  // that changed outside training: DDP's initial broadcast of rank 0's weights, weights
  // loaded by hand.
  void copy_model_to_masters();

  // {"policy": str, "skipped_steps": int, "grad_scaler": dict (empty without scaling),
  //  "master_weights": {name: float32 tensor} (empty without masters)}.
  c10::IValue state_dict() const;
  // Restores state_dict() output; call after the model's weights are loaded. A None state
  // (a checkpoint written without mixed precision) keeps a fresh scaler and sets the masters
  // from the model's weights. Throws CheckpointError for malformed state or masters that do
  // not match the model.
  void load_state_dict(const c10::IValue& state);

 private:
  PrecisionPolicy policy_;
  c10::Device device_;
  bool check_finite_without_scaler_;
  FoundInfReducer reducer_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<MasterWeights> masters_;
  int64_t skipped_steps_ = 0;
  bool found_non_finite_ = false; // this step's unscale_ result

  // The optimizer parameters' gradients, copied up to the masters first (O2).
  std::vector<at::Tensor> gradients_to_check(const std::vector<at::Tensor>& optimizer_params);
};

} // namespace largo::precision
