// LARC (layer-wise adaptive rate control) around any Largo optimizer, with Apex's algorithm
// (apex.parallel.LARC, the one VISSL uses; ../shared/reference/ANCHORS.md) and VISSL's
// defaults. For each parameter group, in step():
//   1. wd = the group's weight_decay; the inner optimizer sees weight_decay 0 for the step;
//   2. for each parameter with a gradient, pn = ||p||, gn = ||g||; only when both are
//      non-zero: adaptive_lr = trust_coefficient * pn / (gn + pn * wd + eps), with clip
//      adaptive_lr = min(adaptive_lr / lr, 1); then g += wd * p and g *= adaptive_lr
//      (a parameter with a zero norm keeps its gradient: no decay, no scaling, as in Apex);
//   3. the inner optimizer's step(), then weight_decay is restored.
// VISSL allows LARC only around SGD; Largo wraps any optimizer (SGD, AdamW, LAMB).
//
// Like Apex, LARC rewrites the gradients in place (after step() they hold the adapted
// gradients). It must see *unscaled* gradients: run it after the loss scaler's unscale
// (and after global-norm clipping), i.e. zero_grad → forward → backward → unscale → clip →
// step (LARC, then the inner update).
//
// Excluded parameters (LARS practice: BatchNorm and bias parameters; fill the set with
// bias_and_norm_parameter_names() from param_groups.h) keep adaptive_lr = 1: their weight
// decay is still folded into the gradient (g += wd * p, SGD's own L2 term) but never scaled.
//
// Sharding: the norms are computed as partial squared norms for every parameter in one
// tensor and completed by the PartialNormReducer (set_norm_reducer, see optimizer.h and
// tensor_norms.h) before the zero checks, so LARC over a shard (a subset of the parameters
// or 1-D pieces of them) matches the unsharded result. Collective: the reducer's, once per
// step, plus whatever the inner optimizer's step() issues.
//
// State: LARC has none of its own. state_dict() is the inner optimizer's (type included, as
// Apex's LARC returns its optimizer's), plus a "larc" entry recording the options; a
// checkpoint written with or without LARC loads either way, and differing saved options
// are reported as a warning (the configuration is the source of truth on resume).
#pragma once

#include <largo/optim/optimizer.h>

#include <memory>
#include <string>
#include <unordered_set>

namespace largo::optim {

struct LARCOptions {
  double trust_coefficient = 0.001; // OPTIMIZER.larc_config.trust_coefficient (Apex: 0.02)
  bool clip = false;                // OPTIMIZER.larc_config.clip (Apex: True)
  double eps = 1e-8;                // OPTIMIZER.larc_config.eps
  // Names of parameters LARC does not adapt (see above);
  // OPTIMIZER.larc_config.exclude_bias_and_norm fills it with the BatchNorm and bias names.
  std::unordered_set<std::string> excluded_from_adaptation;
  // The fused CPU pass for folding and scaling where the tensors allow it; false forces
  // ATen's _foreach ops.
  bool fused = true;
};

class LARC : public Optimizer {
 public:
  // Throws ConfigError naming the key and value for trust_coefficient <= 0 or eps < 0, or
  // largo::Error for a null inner optimizer.
  LARC(std::unique_ptr<Optimizer> inner, LARCOptions options = {});

  void step() override;
  // The inner optimizer's type: checkpoints hold the inner optimizer's state.
  std::string type() const override {
    return inner_->type();
  }
  const LARCOptions& options() const {
    return options_;
  }
  Optimizer& inner() {
    return *inner_;
  }

  // Everything below forwards to the inner optimizer (one set of groups and state).
  std::vector<ParamGroup>& param_groups() override {
    return inner_->param_groups();
  }
  const std::vector<ParamGroup>& param_groups() const override {
    return inner_->param_groups();
  }
  const ParamState* find_state(const std::string& param_name) const override {
    return inner_->find_state(param_name);
  }
  ParamState& state(const std::string& param_name) override {
    return inner_->state(param_name);
  }
  int64_t state_bytes() const override {
    return inner_->state_bytes();
  }
  // LARC keeps the reducer for its own norms and passes it on (for LAMB's).
  void set_norm_reducer(PartialNormReducer reducer) override;
  c10::IValue state_dict() const override;
  void load_state_dict(const c10::IValue& state_dict) override;

 private:
  std::unique_ptr<Optimizer> inner_;
  LARCOptions options_;
};

} // namespace largo::optim
