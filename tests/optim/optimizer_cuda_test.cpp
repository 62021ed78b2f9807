// The optimizers on CUDA tensors (SGD through ATen's fused kernel, and through the _foreach
// path with fused = false; the others through the _foreach path, ATen's multi-tensor kernels)
// agree with the fused CPU pass, for every optimizer (Adam and RMSprop not run on a GPU yet),
// LARC and global-norm clipping (LARS, which has only the _foreach path, with that path on
// the CPU). Skipped without a GPU.
#include "optim_test_util.h"

#include <largo/optim/grad_clipping.h>
#include <largo/optim/optimizer_factory.h>

namespace largo::optim::optimizer_cuda_test {
namespace {

using testing::make_params;
using testing::set_grads;

std::vector<ParamGroup> groups_over(const std::vector<at::Tensor>& params) {
  ParamGroup decayed;
  decayed.params = {params[0], params[2]};
  decayed.names = {"w", "v"};
  decayed.lr = 0.05;
  decayed.weight_decay = 0.01;
  ParamGroup plain;
  plain.params = {params[1]};
  plain.names = {"b"};
  plain.lr = 0.02;
  return {decayed, plain};
}

// float64 on both devices; CUDA kernels round like the CPU ones up to fused multiply-adds
// and reduction order: 1e-12 relative after 30 steps (a wrong branch is >= 1e-4).
constexpr double kTolerance = 1e-12;

TEST(OptimizerCuda, FusedAndForeachOnCudaMatchTheFusedCpuPass) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: the CUDA path is checked on GPU machines only";
  }
  std::vector<std::pair<std::string, OptimizerSpec>> specs(11);
  specs[0].first = "sgd";
  specs[0].second.sgd = SGDOptions{0.9, 0.0, true};
  specs[1].first = "adamw";
  specs[1].second.name = "adamw";
  specs[1].second.adamw.amsgrad = true;
  specs[2].first = "lamb";
  specs[2].second.name = "lamb";
  specs[3].first = "larc_sgd";
  specs[3].second.sgd.momentum = 0.9;
  specs[3].second.use_larc = true;
  specs[3].second.larc.trust_coefficient = 0.02;
  specs[3].second.larc.clip = true;
  specs[4].first = "larc_lamb";
  specs[4].second.name = "lamb";
  specs[4].second.use_larc = true;
  specs[4].second.larc.excluded_from_adaptation = {"b"};
  specs[5].first = "sgd_clipped";
  specs[5].second.sgd.momentum = 0.9;
  specs[6].first = "sgd_foreach"; // SGD's _foreach path on CUDA (SGD above: ATen's fused kernel)
  specs[6].second.sgd = SGDOptions{0.9, 0.0, true};
  specs[6].second.sgd.fused = false;
  specs[7].first = "sgd_no_momentum"; // the fused kernel without momentum buffers
  specs[7].second.sgd.momentum = 0.0;
  specs[8].first = "lars"; // _foreach ops and the norms on CUDA (not run on a GPU yet)
  specs[8].second.name = "lars";
  specs[8].second.lars.eta = 0.02;
  specs[8].second.lars.excluded_from_adaptation = {"b"};
  specs[9].first = "adam"; // L2 decay in the moments (not run on a GPU yet)
  specs[9].second.name = "adam";
  specs[9].second.adam.amsgrad = true;
  specs[10].first = "rmsprop"; // centered, momentum (not run on a GPU yet)
  specs[10].second.name = "rmsprop";
  specs[10].second.rmsprop.momentum = 0.9;
  specs[10].second.rmsprop.centered = true;
  for (const auto& [label, spec] : specs) {
    const bool clip = label == "sgd_clipped";
    std::vector<at::Tensor> cpu = make_params({{3, 4}, {5}, {40000}});
    std::vector<at::Tensor> cuda;
    for (const at::Tensor& p : cpu) {
      cuda.push_back(p.detach().to(at::kCUDA).requires_grad_());
    }
    auto cpu_optimizer = make_optimizer(groups_over(cpu), spec);
    auto cuda_optimizer = make_optimizer(groups_over(cuda), spec);
    for (int64_t step = 1; step <= 30; ++step) {
      set_grads(cpu, step);
      for (size_t k = 0; k < cpu.size(); ++k) {
        cuda[k].mutable_grad() = cpu[k].grad().to(at::kCUDA);
      }
      if (clip) {
        const double cpu_norm = clip_grad_norm(cpu, 1.0);
        const double cuda_norm = clip_grad_norm(cuda, 1.0);
        EXPECT_NEAR(cpu_norm, cuda_norm, kTolerance * cpu_norm) << label;
      }
      cpu_optimizer->step();
      cuda_optimizer->step();
    }
    for (size_t k = 0; k < cpu.size(); ++k) {
      const at::Tensor cuda_on_cpu = cuda[k].detach().to(at::kCPU);
      const double worst =
          ((cuda_on_cpu - cpu[k].detach()).abs() / cpu[k].detach().abs().clamp_min(1.0)).max().item<double>();
      EXPECT_LT(worst, kTolerance) << label << " param " << k;
      EXPECT_GT((cpu[k].detach() - testing::initial_param(static_cast<int64_t>(k), cpu[k].sizes()))
                    .abs()
                    .max()
                    .item<double>(),
                1e-6)
          << label << ": the parameters did not move";
    }
  }
}

// A parameter and its gradient in two layouts, as in a channels-last model: cuDNN hands a 1x1
// convolution's weight gradient with channels-last strides [4, 1, 4, 4] while the weight has
// [4, 1, 1, 1] (contiguous(ChannelsLast) leaves a 1x1 weight as it is, and AccumulateGrad
// keeps such a gradient, the strides of size-1 dimensions not mattering): the same element
// order, so SGD takes ATen's fused kernel. A 3x3 channels-last weight with a contiguous
// gradient differs in the order itself: the foreach path. Both must step as the CPU does.
// (A first version of this test, run on an H200 on 2026-11-28, built the 1x1 case with
// contiguous(ChannelsLast) and stopped at its own layout check: not yet rerun.)
TEST(OptimizerCuda, SgdStepsParametersAndGradientsOfOtherLayoutsAsTheCpuDoes) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: the CUDA path is checked on GPU machines only";
  }
  std::vector<at::Tensor> cpu = make_params({{8, 4, 1, 1}, {6, 3, 3, 3}});
  std::vector<at::Tensor> cuda = {
      cpu[0].detach().to(at::kCUDA).requires_grad_(),
      cpu[1].detach().to(at::kCUDA).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_()};
  auto groups = [](std::vector<at::Tensor> params) {
    ParamGroup group;
    group.params = std::move(params);
    group.names = {"one_by_one", "three_by_three"};
    group.lr = 0.05;
    group.weight_decay = 0.01;
    return std::vector<ParamGroup>{group};
  };
  SGD cpu_optimizer(groups(cpu), SGDOptions{0.9, 0.0, true});
  SGD cuda_optimizer(groups(cuda), SGDOptions{0.9, 0.0, true});
  for (int64_t step = 1; step <= 30; ++step) {
    set_grads(cpu, step);
    cuda[0].mutable_grad() =
        at::empty_strided({8, 4, 1, 1}, {4, 1, 4, 4}, cuda[0].options()).copy_(cpu[0].grad());
    cuda[1].mutable_grad() = cpu[1].grad().to(at::kCUDA); // contiguous
    ASSERT_NE(cuda[0].grad().strides(), cuda[0].strides());
    ASSERT_NE(cuda[1].grad().strides(), cuda[1].strides());
    cpu_optimizer.step();
    cuda_optimizer.step();
  }
  for (size_t k = 0; k < cpu.size(); ++k) {
    const at::Tensor cuda_on_cpu = cuda[k].detach().to(at::kCPU);
    const double worst =
        ((cuda_on_cpu - cpu[k].detach()).abs() / cpu[k].detach().abs().clamp_min(1.0))
            .max()
            .item<double>();
    EXPECT_LT(worst, kTolerance) << "param " << k;
  }
}

} // namespace
} // namespace largo::optim::optimizer_cuda_test
