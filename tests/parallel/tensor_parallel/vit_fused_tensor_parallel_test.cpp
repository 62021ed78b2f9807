// The ViT layer's fused path under tensor parallelism, with and without sequence parallelism,
// on two ranks (Gloo): fc1 runs as ColumnParallelLinear::forward_without_bias followed by
// kernels::bias_gelu with this rank's share of the bias, and the attention branch's add +
// norm2 as kernels::add_layer_norm with the norm's weights summed over the shards under
// sequence parallelism. VitFusedKernels::kEverywhere takes that path on the CPU, where the
// kernels run ATen's sequence; with fc1 weights of one power of two per row (the bias
// addition exact whether inside addmm or after the product: tests/models/vit_fused_test.cpp)
// the sharded fused model equals the sharded unfused one bit for bit: the loss and every
// gradient of this rank's parameters. Without sequence parallelism the fused graph also holds
// one addmm fewer per layer, showing the path is taken (with it, the product is Largo's
// sequence-gathered function either way).
#include <largo/models/vit.h>
#include <largo/parallel/tensor_parallel/tensor_parallel_plan.h>

#include "comm/distributed_test_util.h"
#include "models/vit_fused_test_util.h"
#include "parallel/parallelize_test_util.h"
#include "parallel/tensor_parallel_test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace largo::parallel::vit_fused_tensor_parallel_test {
namespace {

using largo::testing::run_on_ranks;
using testing::borrow;
using testing::small_vit_options;
using testing::with_linear_head;

constexpr int64_t kClasses = 5;

// Every fc1 weight with exact products (models::testing::make_fc1_weight_exact).
void make_fc1_exact(torch::nn::Module& model) {
  for (auto& named : model.named_parameters()) {
    const std::string& name = named.key();
    if (name.size() >= 10 && name.compare(name.size() - 10, 10, "fc1.weight") == 0) {
      models::testing::make_fc1_weight_exact(named.value());
    }
  }
}

struct Result {
  at::Tensor loss;
  std::vector<at::Tensor> gradients; // this rank's parameters', in named order
  int addmm_nodes = 0;
};

Result sharded_step(comm::ProcessGroup& group, models::VitFusedKernels fused, bool sequence) {
  torch::manual_seed(12);
  models::VitOptions options = small_vit_options();
  options.fused_kernels = fused;
  auto model = with_linear_head(models::build_vit_trunk(options, 3, 16), kClasses);
  model->to(at::kDouble);
  make_fc1_exact(*model);
  TensorParallelPlanOptions plan;
  plan.sequence_parallel = sequence;
  apply_tensor_parallel(*model, borrow(group), plan);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(31);
  const at::Tensor images = at::randn({4, 3, 16, 16}, generator, at::kDouble);
  const at::Tensor labels = at::randint(0, kClasses, {4}, generator);
  Result result;
  result.loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
  result.addmm_nodes = models::testing::count_autograd_nodes(result.loss, "AddmmBackward");
  result.loss.backward();
  for (const auto& parameter : model->parameters()) {
    result.gradients.push_back(parameter.grad());
  }
  return result;
}

TEST(VitFusedTensorParallelTest, FusedPathEqualsTheUnfusedShardsBitForBit) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    for (const bool sequence : {false, true}) {
      SCOPED_TRACE(sequence ? "with sequence parallelism" : "tensor parallelism alone");
      const Result fused = sharded_step(group, models::VitFusedKernels::kEverywhere, sequence);
      const Result unfused = sharded_step(group, models::VitFusedKernels::kNever, sequence);
      EXPECT_TRUE(fused.loss.equal(unfused.loss));
      ASSERT_EQ(fused.gradients.size(), unfused.gradients.size());
      for (size_t i = 0; i < fused.gradients.size(); ++i) {
        ASSERT_TRUE(fused.gradients[i].defined()) << "parameter " << i;
        EXPECT_TRUE(fused.gradients[i].equal(unfused.gradients[i])) << "parameter " << i;
      }
      if (!sequence) { // one fc1 addmm fewer in each of the 2 layers
        EXPECT_EQ(fused.addmm_nodes, unfused.addmm_nodes - small_vit_options().num_layers);
      }
    }
  });
}

} // namespace
} // namespace largo::parallel::vit_fused_tensor_parallel_test
