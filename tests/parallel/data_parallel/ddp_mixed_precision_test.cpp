// Mixed precision under 2-rank DistributedDataParallel (Gloo over 127.0.0.1): a NaN produced
// on one rank only makes both ranks skip the step and back off the loss scale together, and
// the models stay identical on the ranks. O1 (autocast: float32 weights and gradients) and
// O2 (a bfloat16 model: its gradient buckets are bfloat16, which Gloo reduces since libtorch
// 2.x; float32 master weights).
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/precision/mixed_precision.h>

#include "comm/distributed_test_util.h"

#include <limits>

namespace largo::parallel::ddp_mixed_precision_test {
namespace {

using largo::testing::run_on_ranks;

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

at::Tensor flat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  for (const auto& tensor : tensors) {
    parts.push_back(tensor.detach().to(at::kFloat).reshape({-1}));
  }
  return at::cat(parts);
}

// True when `tensor` is bitwise the same on every rank.
bool same_on_every_rank(comm::ProcessGroup& group, const at::Tensor& tensor) {
  at::Tensor max = tensor.clone();
  at::Tensor min = tensor.clone();
  group.all_reduce(max, comm::ReduceOp::kMax);
  group.all_reduce(min, comm::ReduceOp::kMin);
  return torch::equal(max, min) && torch::equal(max, tensor);
}

void expect_a_nan_on_one_rank_skips_the_step_on_both(const std::string& opt_level) {
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    auto shared = borrow(group);
    torch::manual_seed(group.rank()); // different weights: DDP broadcasts rank 0's
    torch::nn::Sequential net(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)), torch::nn::BatchNorm2d(8),
        torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(8 * 6 * 6, 10));

    precision::PrecisionPolicyOptions amp;
    amp.use_amp = true;
    amp.opt_level = opt_level;
    amp.dtype = "bfloat16";
    amp.loss_scale = "dynamic";
    precision::GradScalerOptions scaler;
    scaler.found_inf_reducer = precision::found_inf_all_reduce(shared);
    // Built before DDP, as the trainer does: under O2/O3 the cast must precede the buckets.
    precision::MixedPrecision mixed(precision::resolve_precision_policy(amp), *net,
                                    c10::Device(c10::kCPU), scaler);
    DistributedDataParallel ddp(net.ptr(), shared);
    mixed.copy_model_to_masters(); // the broadcast changed rank 1's weights (matters for O2)

    optim::ParamGroupOptions group_options;
    group_options.lr = 0.05;
    auto groups = optim::build_param_groups(*net, group_options);
    std::vector<at::Tensor> params;
    for (auto& param_group : groups) {
      for (size_t i = 0; i < param_group.params.size(); ++i) {
        param_group.params[i] =
            mixed.optimizer_param(param_group.names[i], param_group.params[i]);
        params.push_back(param_group.params[i]);
      }
    }
    optim::SGDOptions sgd_options;
    sgd_options.momentum = 0.9;
    optim::SGD sgd(std::move(groups), sgd_options);

    for (int step = 0; step < 4; ++step) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + 2 * step + group.rank());
      at::Tensor images = at::randn({4, 3, 6, 6}, generator);
      at::Tensor labels = at::randint(0, 10, {4}, generator);
      const bool poisoned = group.rank() == 1 && step == 1;
      if (poisoned) {
        images[0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
      }
      at::Tensor masters_before = flat(params);
      sgd.zero_grad();
      at::Tensor logits =
          mixed.forward([&](const at::Tensor& x) { return ddp.forward(net, x); }, images);
      at::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
      EXPECT_EQ(std::isfinite(loss.item<float>()), !poisoned);
      mixed.backward(loss);
      const bool finite = mixed.unscale_(params);
      const bool stepped = mixed.step([&] { sgd.step(); });
      EXPECT_EQ(finite, step != 1) << "rank " << group.rank() << " step " << step;
      EXPECT_EQ(stepped, step != 1) << "rank " << group.rank() << " step " << step;
      if (!stepped) {
        EXPECT_TRUE(torch::equal(flat(params), masters_before)) << "skipped: masters unchanged";
      }
      EXPECT_TRUE(same_on_every_rank(group, flat(params))) << "masters, step " << step;
      EXPECT_TRUE(same_on_every_rank(group, flat(net->parameters()))) << "model, step " << step;
    }
    EXPECT_EQ(mixed.skipped_steps(), 1);
    EXPECT_EQ(mixed.loss_scale(), 32768.0);
    for (const auto& item : net->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), mixed.optimizer_param(item.key(), item.value())
                                                 .to(item.value().scalar_type())))
          << item.key();
    }
    if (opt_level == "O2") { // the buckets DDP reduced were bfloat16
      EXPECT_EQ(net->named_parameters()["4.weight"].scalar_type(), at::kBFloat16);
    }
  });
}

TEST(DdpMixedPrecisionTest, ANanOnOneRankMakesBothRanksSkipTheStepUnderO1) {
  expect_a_nan_on_one_rank_skips_the_step_on_both("O1");
}

TEST(DdpMixedPrecisionTest, ANanOnOneRankMakesBothRanksSkipTheStepUnderO2Bfloat16) {
  expect_a_nan_on_one_rank_skips_the_step_on_both("O2");
}

} // namespace
} // namespace largo::parallel::ddp_mixed_precision_test
