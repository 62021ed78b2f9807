// Shared by the suites of parallel::parallelize() on models defined in the tests (its data-
// parallel modes and its pipeline mode): the harness's group as a shared_ptr, one parameter
// group over a whole module, SGD with momentum, and a residual block to build nets from.
#pragma once

#include <largo/optim/sgd.h>
#include <largo/parallel/parallelize.h>

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
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

// A residual block with a LayerNorm, of the kind a user writes:
// x + fc2(gelu(fc1(norm(x)))), [b, width] -> [b, width].
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 2 * width))),
        fc2(register_module("fc2", torch::nn::Linear(2 * width, width))) {}
  at::Tensor forward(at::Tensor x) {
    return x + fc2(torch::gelu(fc1(norm(x))));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

inline OptimizerFactory sgd_momentum() {
  return [](std::vector<optim::ParamGroup> groups) {
    optim::SGDOptions options;
    options.momentum = 0.9;
    return std::make_unique<optim::SGD>(std::move(groups), options);
  };
}

} // namespace largo::parallel::testing
