// Builds an optimizer from a typed description: the one place that turns OPTIMIZER.name,
// its hyperparameters and the LARC settings into an Optimizer. The trainer uses it, and so
// can a sharded optimizer that must build its base optimizer (OPTIMIZER.base_optimizer)
// over its own shard of the parameters.
#pragma once

#include <largo/optim/adam.h>
#include <largo/optim/adamw.h>
#include <largo/optim/lamb.h>
#include <largo/optim/larc.h>
#include <largo/optim/lars.h>
#include <largo/optim/optimizer.h>
#include <largo/optim/rmsprop.h>
#include <largo/optim/sgd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace largo::optim {

struct OptimizerSpec {
  // OPTIMIZER.name: one of optimizer_names() (lamb: a Largo extension)
  std::string name = "sgd";
  SGDOptions sgd;           // read when name is sgd
  AdamOptions adam;         // read when name is adam
  AdamWOptions adamw;       // read when name is adamw
  RMSpropOptions rmsprop;   // read when name is rmsprop
  LAMBOptions lamb;         // read when name is lamb
  LARSOptions lars;         // read when name is lars
  bool use_larc = false;    // OPTIMIZER.use_larc: wrap the optimizer in LARC
  LARCOptions larc;         // OPTIMIZER.larc_config
};

// The names make_optimizer builds: sgd, adam, adamw, rmsprop, lamb, lars.
const std::vector<std::string>& optimizer_names();

// Throws ConfigError naming OptimizerSpec::name for an unknown name, and the optimizers' own
// ConfigErrors for invalid hyperparameters.
std::unique_ptr<Optimizer> make_optimizer(std::vector<ParamGroup> param_groups, const OptimizerSpec& spec);

// "SGD (momentum 0.9, nesterov true); LARC on (trust_coefficient 0.001, clip false, ...)"
// for the start-up log: what make_optimizer builds from `spec`.
std::string describe(const OptimizerSpec& spec);

// What the optimizer `spec` describes keeps per parameter, for memory estimates before it
// exists (the built optimizer's state_bytes() measures it): its state tensors shaped like the
// parameter, and whether it also keeps a 0-dim float32 "step". LARC adds nothing.
struct OptimizerStateLayout {
  int64_t tensors_per_parameter = 0;
  bool step_scalar = false;
};
OptimizerStateLayout state_layout(const OptimizerSpec& spec);

} // namespace largo::optim
