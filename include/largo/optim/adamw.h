// Adam with decoupled weight decay, the update of torch.optim.AdamW:
//   p *= 1 - lr * weight_decay
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g^2
//   v_max = max(v_max, v)                                   (amsgrad only)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v or v_max) / sqrt(1 - beta2^t) + eps)
// State per parameter: "step" (a 0-dim float32 tensor, as in PyTorch), "exp_avg",
// "exp_avg_sq", and "max_exp_avg_sq" with amsgrad.
// Note: torch.optim.AdamW defaults to weight_decay 0.01; here the decay is the group's
// weight_decay (ParamGroup defaults to 0).
//
// Adam (adam.h) is the same update with the decay as an L2 penalty on the gradient; the two
// share their update paths (adam.h): a fused CPU pass, or torch.optim's _foreach ops.
#pragma once

#include <largo/optim/adam.h>
#include <largo/optim/optimizer.h>

namespace largo::optim {

using AdamWOptions = AdamOptions;

class AdamW : public Optimizer {
 public:
  // Throws ConfigError naming the key and value for betas outside [0, 1) or eps < 0.
  explicit AdamW(std::vector<ParamGroup> param_groups, AdamWOptions options = {});

  void step() override;
  std::string type() const override {
    return "adamw";
  }
  const AdamWOptions& options() const {
    return options_;
  }

 protected:
  std::vector<std::pair<std::string, c10::IValue>> hyperparameters() const override;

 private:
  AdamWOptions options_;
};

} // namespace largo::optim
