// Shared by the suites of parallel::parallelize() on models defined in the tests (its data-
// parallel modes and its pipeline mode): the harness's group as a shared_ptr, one parameter
// group over a whole module, and SGD with momentum.
#pragma once

#include <largo/optim/sgd.h>
#include <largo/parallel/parallelize.h>

#include <memory>
#include <vector>

namespace largo::parallel::testing {

// A shared_ptr to a group the test harness owns.
inline std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

// Every parameter of `net` in one group "all" (lr 0.05).
inline std::vector<optim::ParamGroup> groups_of(torch::nn::Module& net) {
  optim::ParamGroup group;
  for (const auto& item : net.named_parameters()) {
    group.params.push_back(item.value());
    group.names.push_back(item.key());
  }
  group.lr = 0.05;
  group.name = "all";
  return {group};
}

inline OptimizerFactory sgd_momentum() {
  return [](std::vector<optim::ParamGroup> groups) {
    optim::SGDOptions options;
    options.momentum = 0.9;
    return std::make_unique<optim::SGD>(std::move(groups), options);
  };
}

} // namespace largo::parallel::testing
