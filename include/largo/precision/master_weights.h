// Float32 master copies of a low-precision model's parameters (Apex O2): the optimizer
// updates the masters, and the model's weights are the masters cast down after each step, so
// small updates accumulate in float32 instead of vanishing in 8 (bfloat16) or 11 (float16)
// bits of mantissa.
//
// The masters are named like the model's parameters (named_parameters()), so an optimizer
// built on them keeps its state keyed by the model's names. A parameter that already is
// float32 (BatchNorm under keep_batchnorm_fp32) is its own master: no copy is made and its
// gradient is used in place.
//
// Per step:  backward (model grads, low precision)
//            -> copy_grads_to_masters()   master.grad = float32(model.grad); model.grad freed
//            -> unscale / clip / optimizer.step() on the masters
//            -> copy_masters_to_model()   model = masters cast down
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::precision {

class MasterWeights {
 public:
  // The trainable parameters (requires_grad) of `model`, as they are now (cast the model
  // first). Throws largo::Error when a trainable parameter is not floating point.
  explicit MasterWeights(const torch::nn::Module& model);

  // The master of the model parameter `name` (the parameter itself when it is float32).
  // Throws largo::Error for a name that is not a trainable parameter of the model.
  const at::Tensor& master(const std::string& name) const;
  const std::vector<std::string>& names() const {
    return names_;
  }
  // Every master, in named_parameters() order.
  const std::vector<at::Tensor>& masters() const {
    return masters_;
  }

  // master.grad = float32(model.grad) for each low-precision parameter (allocated on first
  // use, then overwritten), and the model's gradient is freed; parameters without a gradient
  // leave their master without one. Float32 parameters keep their gradient where it is.
  void copy_grads_to_masters();
  // model parameter = master, rounded to the model's dtype.
  void copy_masters_to_model();
  // Sets every master from the model's current values (after loading model weights that
  // came without masters).
  void reset_from_model();

  // Bytes of the float32 copies (not counting parameters that are their own master).
  int64_t copy_bytes() const;

  // {name: float32 master} for the parameters that have a separate copy (shares storage).
  c10::impl::GenericDict state_dict() const;
  // Copies the saved masters in (bit-exact) and then the model from them. Throws
  // CheckpointError, before changing anything, for a missing or unexpected name or a shape
  // mismatch.
  void load_state_dict(const c10::impl::GenericDict& state);

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> model_params_;
  std::vector<at::Tensor> masters_;
  std::vector<bool> is_copy_; // false: the parameter is float32 and is its own master
};

} // namespace largo::precision
