// Adam with an L2 penalty, the update of torch.optim.Adam (VISSL's OPTIMIZER.name adam,
// ClassyVision's Adam, which passes the group's weight_decay to torch.optim.Adam):
//   g = grad + weight_decay * p                             (L2: the decay enters the moments)
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g^2
//   v_max = max(v_max, v)                                   (amsgrad only)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v or v_max) / sqrt(1 - beta2^t) + eps)
// State per parameter: "step" (a 0-dim float32 tensor, as in PyTorch), "exp_avg",
// "exp_avg_sq", and "max_exp_avg_sq" with amsgrad: torch.optim.Adam's names, so its
// load_state_dict takes Largo's state_dict().
//
// AdamW (adamw.h) is the same update with the decay decoupled from the moments. Update paths
// as in sgd.h: one fused CPU pass over p, g and the moments for CPU float32/float64
// parameters, ATen's _foreach ops (those of torch.optim.Adam(foreach=True), in its order) for
// everything else or with fused = false.
#pragma once

#include <largo/optim/optimizer.h>

#include <array>

namespace largo::optim {

// The moment settings of Adam and AdamW; lr and weight_decay live in each ParamGroup.
struct AdamOptions {
  std::array<double, 2> betas = {0.9, 0.999}; // OPTIMIZER.betas
  double eps = 1e-8;                          // OPTIMIZER.eps
  bool amsgrad = false;                       // OPTIMIZER.amsgrad
  // The fused CPU pass where the tensors allow it; false forces the _foreach path.
  bool fused = true;
};

class Adam : public Optimizer {
 public:
  // Throws ConfigError naming the key and value for betas outside [0, 1) or eps < 0.
  explicit Adam(std::vector<ParamGroup> param_groups, AdamOptions options = {});

  void step() override;
  std::string type() const override {
    return "adam";
  }
  const AdamOptions& options() const {
    return options_;
  }

 protected:
  std::vector<std::pair<std::string, c10::IValue>> hyperparameters() const override;

 private:
  AdamOptions options_;
};

} // namespace largo::optim
