// Stochastic gradient descent with momentum, the update of torch.optim.SGD:
//   g = grad + weight_decay * p                      (L2 penalty added to the gradient)
//   buf = g (first step), else buf = momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf          (when momentum != 0)
//   p -= lr * g
// State per parameter: "momentum_buffer" (only when momentum != 0).
//
// Three update paths with the same arithmetic: CPU float32/float64 parameters whose gradient
// and buffer have their layout go through one fused pass (each element of p, g and the
// buffer read and written once, all parameters in one parallel region); CUDA parameters
// whose gradient and buffer have their layout through ATen's fused kernel, that of
// torch.optim.SGD(fused=True) (one multi-tensor launch per group instead of the _foreach
// path's five or six, and no temporaries: docs/gpu.md measured what the launches cost a
// ResNet-50 step); everything else (other devices and dtypes, odd layouts, or fused = false)
// through ATen's _foreach_ ops, the ops of torch.optim.SGD(foreach=True), which match
// torch.optim bit for bit. The fused passes evaluate the same expressions per element but
// may round differently (fused multiply-adds): within a few ulp per step
// (tests/optim/optimizer_baseline_test.cpp, tests/optim/optimizer_cuda_test.cpp).
#pragma once

#include <largo/optim/optimizer.h>

namespace largo::optim {

// Optimizer-wide SGD settings; lr and weight_decay live in each ParamGroup.
struct SGDOptions {
  double momentum = 0.0; // OPTIMIZER.momentum
  double dampening = 0.0;
  bool nesterov = false; // OPTIMIZER.nesterov
  // The fused CPU pass or CUDA kernel where the tensors allow it; false forces the _foreach
  // path.
  bool fused = true;
};

class SGD : public Optimizer {
 public:
  // Throws ConfigError naming the key and value for momentum < 0, or nesterov without
  // momentum or with dampening.
  explicit SGD(std::vector<ParamGroup> param_groups, SGDOptions options = {});

  void step() override;
  std::string type() const override {
    return "sgd";
  }
  const SGDOptions& options() const {
    return options_;
  }

 protected:
  std::vector<std::pair<std::string, c10::IValue>> hyperparameters() const override;

 private:
  SGDOptions options_;
};

} // namespace largo::optim
