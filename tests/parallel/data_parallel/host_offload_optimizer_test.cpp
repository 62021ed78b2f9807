// HostOffloadOptimizer on its own (one process, the CPU as both device and host): it steps
// like the optimizer it offloads, bit for bit, following the groups' lr; its state and
// state_dict() are the host optimizer's, interchangeable with the optimizer's own; it passes
// the per-parameter norm reducer on; and it counts its host bytes.
#include <largo/optim/larc.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/data_parallel/host_offload_optimizer.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::parallel::host_offload_optimizer_test {
namespace {

// Two 1-D pieces, as the sharded modes hand them over, with fresh gradients per step.
std::vector<optim::ParamGroup> pieces() {
  torch::manual_seed(11);
  optim::ParamGroup group;
  group.name = "all";
  group.lr = 0.1;
  group.params = {torch::randn({7}), torch::randn({5})};
  group.names = {"a.weight", "b.weight"};
  return {group};
}

void set_gradients(std::vector<optim::ParamGroup>& groups, int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  for (at::Tensor& param : groups.front().params) {
    param.mutable_grad() = at::randn(param.sizes(), generator);
  }
}

std::unique_ptr<optim::Optimizer> sgd(std::vector<optim::ParamGroup> groups) {
  optim::SGDOptions options;
  options.momentum = 0.9;
  return std::make_unique<optim::SGD>(std::move(groups), options);
}

TEST(HostOffloadOptimizerTest, StepsLikeTheOptimizerItOffloadsFollowingTheGroupsLr) {
  auto plain_groups = pieces();
  auto offload_groups = pieces();
  auto plain = sgd(plain_groups);
  auto offloaded = offload_to_host(sgd)(offload_groups);
  for (int step = 0; step < 4; ++step) {
    plain->set_lr(0.1 / (step + 1)); // a schedule sets the lr on the groups callers see
    offloaded->set_lr(0.1 / (step + 1));
    set_gradients(plain_groups, step);
    set_gradients(offload_groups, step);
    if (step == 2) { // a piece without a gradient is not stepped, its momentum kept
      plain_groups.front().params[1].mutable_grad().reset();
      offload_groups.front().params[1].mutable_grad().reset();
    }
    plain->step();
    offloaded->step();
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(torch::equal(offload_groups.front().params[i], plain_groups.front().params[i]))
          << "step " << step << ", piece " << i;
    }
  }
  // The device's pieces are written, not replaced: callers keep their tensors.
  EXPECT_TRUE(
      offloaded->param_groups().front().params[0].is_same(offload_groups.front().params[0]));
}

TEST(HostOffloadOptimizerTest, ItsStateAndStateDictAreTheHostOptimizersAndInterchangeable) {
  auto plain_groups = pieces();
  auto offload_groups = pieces();
  auto plain = sgd(plain_groups);
  auto offloaded = offload_to_host(sgd)(offload_groups);
  set_gradients(plain_groups, 0);
  set_gradients(offload_groups, 0);
  plain->step();
  offloaded->step();
  EXPECT_EQ(offloaded->type(), "sgd");
  const at::Tensor momentum = offloaded->find_state("a.weight")->at("momentum_buffer");
  EXPECT_TRUE(torch::equal(momentum, plain->find_state("a.weight")->at("momentum_buffer")));
  EXPECT_FALSE(momentum.is_same(plain->find_state("a.weight")->at("momentum_buffer")));
  // The offloaded optimizer resumes from the plain one's state (lr included), and continues
  // as the plain one does.
  auto resumed_groups = pieces();
  for (size_t i = 0; i < 2; ++i) {
    resumed_groups.front().params[i].copy_(plain_groups.front().params[i]);
  }
  auto resumed = offload_to_host(sgd)(resumed_groups);
  plain->set_lr(0.03);
  resumed->load_state_dict(plain->state_dict());
  EXPECT_DOUBLE_EQ(resumed->param_groups().front().lr, 0.03);
  set_gradients(plain_groups, 1);
  set_gradients(resumed_groups, 1);
  plain->step();
  resumed->step();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(torch::equal(resumed_groups.front().params[i], plain_groups.front().params[i]));
  }
}

TEST(HostOffloadOptimizerTest, PassesTheNormReducerToTheHostOptimizer) {
  auto make_larc = [](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::LARC>(sgd(std::move(groups)));
  };
  auto groups = pieces();
  auto offloaded = offload_to_host(make_larc)(groups);
  int calls = 0;
  // Quadrupling the parameters' squared norms (the first half of the partials) doubles
  // LARC's trust ratio: the step must then differ from one without the reducer.
  offloaded->set_norm_reducer([&calls](const at::Tensor& partials, optim::NormReduceOp) {
    ++calls;
    at::Tensor reduced = partials.clone();
    reduced.narrow(0, 0, partials.numel() / 2).mul_(4);
    return reduced;
  });
  auto reference_groups = pieces();
  auto reference = offload_to_host(make_larc)(reference_groups);
  set_gradients(groups, 0);
  set_gradients(reference_groups, 0);
  offloaded->step();
  reference->step();
  EXPECT_GT(calls, 0);
  EXPECT_FALSE(torch::equal(groups.front().params[0], reference_groups.front().params[0]));
}

TEST(HostOffloadOptimizerTest, CountsItsHostBytesAndIsFoundBehindAShardedOptimizer) {
  auto groups = pieces();
  auto offloaded = offload_to_host(sgd)(groups);
  set_gradients(groups, 0);
  offloaded->step();
  const auto& host = dynamic_cast<const HostOffloadOptimizer&>(*offloaded);
  // Momentum for 12 elements, and a copy of each piece and of its gradient: 3 x 12 floats.
  EXPECT_EQ(host.state_bytes(), 12 * 4);
  EXPECT_EQ(host.host_bytes(), 3 * 12 * 4);
  EXPECT_EQ(find_host_offload(*offloaded), &host);
  EXPECT_EQ(find_host_offload(*sgd(pieces())), nullptr);

  ShardedOptimizerOptions zero;
  zero.make_base_optimizer = offload_to_host(sgd);
  ShardedOptimizer sharded(pieces(), comm::ProcessGroup::single_process(), zero);
  EXPECT_EQ(find_host_offload(sharded), &sharded.base());
}

} // namespace
} // namespace largo::parallel::host_offload_optimizer_test
