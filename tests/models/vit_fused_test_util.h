// What the ViT fused-path tests share (tests/models/vit_fused_test.cpp and
// tests/parallel/tensor_parallel/vit_fused_tensor_parallel_test.cpp): fc1 weights that make the
// bias addition exact whichever way it is done, and a count of autograd nodes by name.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace largo::models::testing {

// One power of two per row of fc1's weight [out, in], the rest zero: each output is one exact
// product, so addmm (the bias inside) and the product then + bias (the fused path) round the
// same exact sum once, to the same bits, on any BLAS.
inline void make_fc1_weight_exact(at::Tensor weight) {
  torch::NoGradGuard no_grad;
  weight.zero_();
  for (int64_t row = 0; row < weight.size(0); ++row) {
    const double power = std::ldexp(1.0, static_cast<int>(row % 5) - 2) * (row % 2 ? -1 : 1);
    weight[row][(row * 7) % weight.size(1)] = power;
  }
}

// The autograd nodes whose name starts with `prefix` ("AddmmBackward") reachable from `root`'s
// grad_fn, each node once.
inline int count_autograd_nodes(const at::Tensor& root, const std::string& prefix) {
  std::vector<torch::autograd::Node*> pending{root.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int count = 0;
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (node == nullptr || !seen.insert(node).second) {
      continue;
    }
    count += node->name().rfind(prefix, 0) == 0 ? 1 : 0;
    for (const auto& edge : node->next_edges()) {
      pending.push_back(edge.function.get());
    }
  }
  return count;
}

} // namespace largo::models::testing
