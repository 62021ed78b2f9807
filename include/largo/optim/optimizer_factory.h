// Builds an optimizer from a typed description: the one place that turns OPTIMIZER.name,
// its hyperparameters and the LARC settings into an Optimizer. The trainer uses it, and so
// can a sharded optimizer that must build its base optimizer (OPTIMIZER.base_optimizer)
// over its own shard of the parameters.
#pragma once

#include <largo/optim/adamw.h>
#include <largo/optim/lamb.h>
#include <largo/optim/larc.h>
#include <largo/optim/lars.h>
#include <largo/optim/optimizer.h>
#include <largo/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

namespace largo::optim {

struct OptimizerSpec {
  // OPTIMIZER.name: sgd | adamw | lamb | lars (lamb: a Largo extension)
  std::string name = "sgd";
  SGDOptions sgd;           // read when name is sgd
  AdamWOptions adamw;       // read when name is adamw
  LAMBOptions lamb;         // read when name is lamb
  LARSOptions lars;         // read when name is lars
  bool use_larc = false;    // OPTIMIZER.use_larc: wrap the optimizer in LARC
  LARCOptions larc;         // OPTIMIZER.larc_config
};

// Throws ConfigError naming OptimizerSpec::name for an unknown name, and the optimizers' own
// ConfigErrors for invalid hyperparameters.
std::unique_ptr<Optimizer> make_optimizer(std::vector<ParamGroup> param_groups, const OptimizerSpec& spec);

// "SGD (momentum 0.9, nesterov true); LARC on (trust_coefficient 0.001, clip false, ...)"
// for the start-up log: what make_optimizer builds from `spec`.
std::string describe(const OptimizerSpec& spec);

} // namespace largo::optim
