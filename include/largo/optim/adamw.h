// Adam with decoupled weight decay, the update of torch.optim.AdamW (PyTorch 1.13):
//   p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   v_max = max(v_max, v)                                   (amsgrad only)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v or v_max) / sqrt(1 - beta2^t) + eps)
// State per parameter: "step" (a 0-dim float32 tensor, as in PyTorch), "exp_avg",
// "exp_avg_sq", and "max_exp_avg_sq" with amsgrad.
// Note: torch.optim.AdamW defaults to weight_decay 0.01; here the decay is the group's
// weight_decay (ParamGroup defaults to 0).
//
// Update paths as in sgd.h: one fused CPU pass over p, g and the moments for CPU
// float32/float64 parameters, ATen's _foreach ops (torch.optim.AdamW(foreach=True), bit for
// bit) for everything else or with fused = false.
#pragma once

#include <largo/optim/optimizer.h>

#include <array>

namespace largo::optim {

struct AdamWOptions {
  std::array<double, 2> betas = {0.9, 0.999}; // OPTIMIZER.betas
  double eps = 1e-8;                          // OPTIMIZER.eps
  bool amsgrad = false;                       // OPTIMIZER.amsgrad
  // The fused CPU pass where the tensors allow it; false forces the _foreach path.
  bool fused = true;
};

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
