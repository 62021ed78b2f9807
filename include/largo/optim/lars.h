// LARS (You et al., "Large Batch Training of Convolutional Networks", 2017) as VISSL's
// `lars` optimizer has it (vissl/optimizers/lars.py, from the Barlow Twins code), the
// update that tests/reference/reference_optimizers.py's LARS writes in Python:
//   dp = g + weight_decay * p                                  (a new tensor; g is kept)
//   unless p is excluded from adaptation:
//     q = eta * ||p|| / ||dp|| when both norms are > 0, else 1  (the trust ratio)
//     dp = dp * q
//   mu = momentum * mu + dp;   p -= lr * mu
// State per parameter: "mu" (zeros before the first step). Unlike LARC (larc.h), LARS is an
// optimizer of its own: the trust ratio multiplies the decayed gradient and there is no
// clip, no eps and no inner optimizer.
//
// Exclusion (VISSL's exclude_bias_and_norm leaves out every parameter with p.ndim == 1:
// biases and norm layers' weights) is by name, decided from the whole parameters by whoever
// builds the optimizer: under ZeRO and FSDP this optimizer sees 1-D pieces of every
// parameter, whose own ndim says nothing (see one_dimensional_parameter_names in
// param_groups.h).
//
// Sharding: as in lamb.h, the norms are completed by the PartialNormReducer before the
// ratios: one [2 * P] float64 tensor per step, the squared norms of the parameters and then
// of the decayed gradients dp (zeros for parameters without a gradient or excluded).
// Collective: the reducer's, once per step, on every rank.
//
// One update path, ATen's _foreach ops (the ops of the Python reference, in its order). It
// holds dp for every parameter with a gradient until the step ends: one gradient's worth of
// temporaries (a fused CPU pass as SGD's would avoid them; not written yet).
#pragma once

#include <largo/optim/optimizer.h>

#include <string>
#include <unordered_set>

namespace largo::optim {

struct LARSOptions {
  double momentum = 0.9; // OPTIMIZER.momentum, in [0, 1) as VISSL requires
  double eta = 0.001;    // OPTIMIZER.eta, the trust coefficient
  // Names of parameters left out of the adaptation (their dp keeps q = 1; weight decay
  // still applies); OPTIMIZER.exclude_bias_and_norm fills it with the 1-D parameters.
  std::unordered_set<std::string> excluded_from_adaptation;
};

class LARS : public Optimizer {
 public:
  // Throws ConfigError naming the key and value for momentum outside [0, 1) or eta <= 0.
  explicit LARS(std::vector<ParamGroup> param_groups, LARSOptions options = {});

  void step() override;
  std::string type() const override {
    return "lars";
  }
  const LARSOptions& options() const {
    return options_;
  }

 protected:
  std::vector<std::pair<std::string, c10::IValue>> hyperparameters() const override;

 private:
  LARSOptions options_;
};

} // namespace largo::optim
