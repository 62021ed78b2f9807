// LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
// minutes", ICLR 2020, Algorithm 2): Adam's moments with a per-parameter trust ratio.
// PyTorch has no LAMB; Largo's is this algorithm, the one tests/reference/gen_optim_baselines.py
// implements in Python:
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p
//   r = ||p|| / ||u|| when both norms are non-zero, else 1          (the trust ratio)
//   p -= lr * r * u
// State per parameter: "step" (0-dim float32, as AdamW's), "exp_avg", "exp_avg_sq".
// Weight decay is the group's (decoupled: it enters u, not the moments).
//
// Sharding: the norms are per parameter. Each step computes this rank's partial squared
// norms of p and u for every parameter it holds in one tensor and passes it through the
// PartialNormReducer (tensor_norms.h) before the ratios are formed, so an optimizer over a
// subset of the parameters, or over 1-D pieces of them, gives the unsharded result once a
// sharded wrapper installs a reducer that sums over its ranks. Collective: the reducer's.
//
// Update paths as in sgd.h: two fused CPU passes (moments and partial norms; then the
// update, recomputing u rather than storing it) or ATen's _foreach ops.
#pragma once

#include <largo/optim/optimizer.h>

#include <array>

namespace largo::optim {

struct LAMBOptions {
  std::array<double, 2> betas = {0.9, 0.999}; // OPTIMIZER.betas
  double eps = 1e-6;                          // OPTIMIZER.eps (the paper's value)
  // The fused CPU passes where the tensors allow it; false forces the _foreach path.
  bool fused = true;
};

class LAMB : public Optimizer {
 public:
  // Throws ConfigError naming the key and value for betas outside [0, 1) or eps < 0.
  explicit LAMB(std::vector<ParamGroup> param_groups, LAMBOptions options = {});

  void step() override;
  std::string type() const override {
    return "lamb";
  }
  const LAMBOptions& options() const {
    return options_;
  }
 protected:
  std::vector<std::pair<std::string, c10::IValue>> hyperparameters() const override;

 private:
  LAMBOptions options_;
};

} // namespace largo::optim
