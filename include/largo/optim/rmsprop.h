// RMSprop, the update of torch.optim.RMSprop (VISSL's OPTIMIZER.name rmsprop, ClassyVision's
// RMSProp, which passes its settings to torch.optim.RMSprop):
//   g = grad + weight_decay * p                           (L2 penalty added to the gradient)
//   s = alpha * s + (1 - alpha) * g^2
//   centered: a = lerp(a, g, 1 - alpha);  d = sqrt(s - a^2) + eps,  else d = sqrt(s) + eps
//   momentum > 0: buf = momentum * buf + g / d;  p -= lr * buf
//   otherwise:    p -= lr * g / d
// State per parameter: "step" (a 0-dim float32 tensor, as in PyTorch; it counts, the update
// does not use it), "square_avg", "momentum_buffer" with momentum > 0, "grad_avg" when
// centered: torch.optim.RMSprop's names, so its load_state_dict takes Largo's state_dict().
//
// Update paths as in sgd.h: one fused CPU pass over p, g and the state for CPU float32/float64
// parameters, ATen's _foreach ops (those of torch.optim.RMSprop(foreach=True), in its order)
// for everything else or with fused = false.
#pragma once

#include <largo/optim/optimizer.h>

namespace largo::optim {

// Optimizer-wide RMSprop settings; lr and weight_decay live in each ParamGroup. The defaults
// are torch.optim.RMSprop's (VISSL's config sets momentum 0.9 through OPTIMIZER.momentum).
struct RMSpropOptions {
  double alpha = 0.99;   // OPTIMIZER.alpha: the smoothing constant of the squared gradients
  double eps = 1e-8;     // OPTIMIZER.eps
  double momentum = 0.0; // OPTIMIZER.momentum
  bool centered = false; // OPTIMIZER.centered: divide by the gradients' estimated deviation
  // The fused CPU pass where the tensors allow it; false forces the _foreach path.
  bool fused = true;
};

class RMSprop : public Optimizer {
 public:
  // Throws ConfigError naming the key and value for alpha or momentum outside [0, 1), or
  // eps <= 0 (ClassyVision's rules; NaN included).
  explicit RMSprop(std::vector<ParamGroup> param_groups, RMSpropOptions options = {});

  void step() override;
  std::string type() const override {
    return "rmsprop";
  }
  const RMSpropOptions& options() const {
    return options_;
  }

 protected:
  std::vector<std::pair<std::string, c10::IValue>> hyperparameters() const override;

 private:
  RMSpropOptions options_;
};

} // namespace largo::optim
