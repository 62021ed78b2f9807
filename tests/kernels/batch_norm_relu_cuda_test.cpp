// The fused CUDA kernels of batch_norm_relu / batch_norm_add_relu against ATen's unfused
// sequence on the same GPU (at::batch_norm, + residual, relu), in float32, bfloat16 and
// float16, training and evaluation, over shapes from 8x7x7 to 256x56x56 positions and channel
// counts that no vector width divides: outputs, the saved and the running statistics, and the
// gradients of input, weight, bias and residual, each against ATen's and against the exact
// (float64) value, within bounds derived from the dtype and the reduction length (below), so
// that a failure also says whose error exceeds its bound. Also: the layouts and
// dtypes the kernels do not take run ATen's path bit for bit, a gradient in another layout is
// accepted, and two runs give the same bits (the reductions have a fixed order).
// Skipped without a GPU (scripts/gpu_check.sh runs them).
#include <largo/kernels/batch_norm_relu.h>

#include "kernels/cuda_kernels_skip.h"
#include "kernels/kernel_test_bounds.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <tuple>

namespace largo::kernels::batch_norm_relu_cuda_test {
namespace {

// ---- tolerances (kernel_test_bounds.h derives them) ----------------------------------------
// Reductions run over M = N * H * W values in float32 (mean, variance, sum(g),
// sum(g * (x - mean))): gamma(M) at M = 802816 is 5.3e-4, where the worst-case M u (0.048) would
// pass a kernel that drops every 30th row.
using test_bounds::expect_near_both;
using test_bounds::expect_within;
using test_bounds::gamma_bound;
using test_bounds::kFloat32Roundoff;
using test_bounds::unit_roundoff;

constexpr double kMomentum = 0.1;
constexpr double kEps = 1e-5;
const std::vector<int64_t> kChannelDims = {0, 2, 3};

// [C] -> [1, C, 1, 1], to broadcast over an [N, C, H, W] tensor.
at::Tensor per_channel(const at::Tensor& vector) {
  return vector.view({1, -1, 1, 1});
}

// ---- one case -----------------------------------------------------------------------------

struct Case {
  at::ScalarType dtype;
  std::vector<int64_t> sizes; // [N, C, H, W]
  bool residual;
  bool training;
};

std::string describe(const Case& c) {
  return std::string(c10::toString(c.dtype)) + " " + c10::str(at::IntArrayRef(c.sizes)) +
         (c.residual ? " add" : "") + (c.training ? " training" : " eval");
}

struct Inputs {
  at::Tensor input; // T, channels-last
  at::Tensor residual;
  at::Tensor weight; // float32 [C]
  at::Tensor bias;
  at::Tensor running_mean;
  at::Tensor running_var;
  at::Tensor grad_output; // T, channels-last
};

// Channels with their own offset (|mean| up to 3 spreads) and scale, and a drift along the
// batch, so that the chunks a reduction splits the rows into see different values (a lost or
// doubled chunk moves the statistics far beyond the bounds).
Inputs make_inputs(const Case& c) {
  torch::manual_seed(4343);
  const auto on_gpu = torch::device(torch::kCUDA);
  const auto channels_last = at::MemoryFormat::ChannelsLast;
  const int64_t batch = c.sizes[0];
  const int64_t channels = c.sizes[1];
  const at::Tensor offset = per_channel(torch::rand({channels}, on_gpu) * 4.0 - 2.0);
  const at::Tensor scale = per_channel(torch::rand({channels}, on_gpu) * 1.5 + 0.5);
  const at::Tensor drift = torch::linspace(0.0, 1.0, batch, on_gpu).view({batch, 1, 1, 1});
  Inputs inputs;
  inputs.input = (torch::randn(c.sizes, on_gpu) * scale + offset + drift)
                     .to(c.dtype)
                     .contiguous(channels_last);
  if (c.residual) {
    inputs.residual = torch::randn(c.sizes, on_gpu).to(c.dtype).contiguous(channels_last);
  }
  inputs.weight = torch::rand({channels}, on_gpu) + 0.5;
  inputs.bias = torch::randn({channels}, on_gpu) * 0.2;
  inputs.running_mean = torch::randn({channels}, on_gpu) * 0.1;
  inputs.running_var = torch::rand({channels}, on_gpu) + 0.5;
  inputs.grad_output = torch::randn(c.sizes, on_gpu).to(c.dtype).contiguous(channels_last);
  return inputs;
}

struct Results {
  at::Tensor output;
  at::Tensor running_mean;
  at::Tensor running_var;
  at::Tensor grad_input;
  at::Tensor grad_weight;
  at::Tensor grad_bias;
  at::Tensor grad_residual;
};

struct Leaves {
  at::Tensor input;
  at::Tensor residual;
  at::Tensor weight;
  at::Tensor bias;
  std::vector<at::Tensor> list() const {
    std::vector<at::Tensor> leaves = {input, weight, bias};
    if (residual.defined()) {
      leaves.push_back(residual);
    }
    return leaves;
  }
};

Leaves leaves_of(const Inputs& inputs) {
  Leaves leaves;
  leaves.input = inputs.input.clone().requires_grad_();
  leaves.residual =
      inputs.residual.defined() ? inputs.residual.clone().requires_grad_() : at::Tensor();
  leaves.weight = inputs.weight.clone().requires_grad_();
  leaves.bias = inputs.bias.clone().requires_grad_();
  return leaves;
}

void take_grads(Results& run, const std::vector<at::Tensor>& grads) {
  run.grad_input = grads[0];
  run.grad_weight = grads[1];
  run.grad_bias = grads[2];
  if (grads.size() > 3) {
    run.grad_residual = grads[3];
  }
}

Results run_fused(const Case& c, const Inputs& inputs) {
  const Leaves leaves = leaves_of(inputs);
  Results run;
  run.running_mean = inputs.running_mean.clone();
  run.running_var = inputs.running_var.clone();
  EXPECT_TRUE(uses_fused_batch_norm(
      leaves.input,
      leaves.residual,
      leaves.weight,
      leaves.bias,
      run.running_mean,
      run.running_var));
  run.output = c.residual ? batch_norm_add_relu(
                                leaves.input,
                                leaves.residual,
                                leaves.weight,
                                leaves.bias,
                                run.running_mean,
                                run.running_var,
                                c.training,
                                kMomentum,
                                kEps)
                          : batch_norm_relu(
                                leaves.input,
                                leaves.weight,
                                leaves.bias,
                                run.running_mean,
                                run.running_var,
                                c.training,
                                kMomentum,
                                kEps);
  take_grads(run, torch::autograd::grad({run.output}, leaves.list(), {inputs.grad_output}));
  return run;
}

// ATen's unfused sequence. Its backward is given the fused output's ReLU mask: where the two
// pre-activations straddle 0 within rounding, the masks differ and so would every gradient of
// that element, by a whole dy; the forward comparison already bounds those elements (ReLU is
// 1-Lipschitz, so both outputs there are within the output bound of 0). Given one mask, the
// gradients compare BatchNorm's backward, ATen's against the fused one.
Results run_unfused(const Case& c, const Inputs& inputs, const at::Tensor& fused_output) {
  const Leaves leaves = leaves_of(inputs);
  Results run;
  run.running_mean = inputs.running_mean.clone();
  run.running_var = inputs.running_var.clone();
  const at::Tensor normalized = torch::batch_norm(
      leaves.input,
      leaves.weight,
      leaves.bias,
      run.running_mean,
      run.running_var,
      c.training,
      kMomentum,
      kEps,
      at::globalContext().userEnabledCuDNN());
  const at::Tensor pre_activation = c.residual ? normalized + leaves.residual : normalized;
  run.output = pre_activation.relu();
  // ReLU's backward, ATen's threshold_backward, on the fused output's mask.
  const at::Tensor masked_grad =
      at::threshold_backward(inputs.grad_output, fused_output.detach(), 0);
  take_grads(run, torch::autograd::grad({pre_activation}, leaves.list(), {masked_grad}));
  return run;
}

// The exact (float64) statistics of a case and the bounds of one float32 implementation's
// error on them.
struct Statistics {
  at::Tensor mean;                  // [C], the batch's (training) or the running mean (evaluation)
  at::Tensor invstd;                // [C]
  at::Tensor mean_error;            // [C] bound on |computed mean - mean|
  at::Tensor var_error;             // [C] bound on |computed biased variance - variance|
  at::Tensor invstd_relative_error; // [C]
  at::Tensor var;                   // [C] biased variance (training)
};

Statistics exact_statistics(const Case& c, const Inputs& inputs) {
  const at::Tensor x = inputs.input.to(at::kDouble);
  const int64_t rows = c.sizes[0] * c.sizes[2] * c.sizes[3];
  const double gamma = gamma_bound(rows);
  const double u = kFloat32Roundoff;
  Statistics stats;
  if (c.training) {
    stats.mean = x.mean(kChannelDims);
    stats.var = x.var(kChannelDims, /*unbiased=*/false);
    // The mean: a sum of M values (scaled by 1/M), and its rounding to float32.
    stats.mean_error = gamma * x.abs().mean(kChannelDims) + u * stats.mean.abs();
    // The variance: whether computed as Welford's M2 or as E[x^2] - E[x]^2, the error of its
    // sums is bounded by gamma * mean(x^2) (= gamma * (var + mean^2): the condition of the
    // textbook formula, which bounds Welford's too).
    stats.var_error = gamma * x.square().mean(kChannelDims) + u * stats.var;
  } else {
    stats.mean = inputs.running_mean.to(at::kDouble);
    stats.var = inputs.running_var.to(at::kDouble);
    stats.mean_error = torch::zeros_like(stats.mean);
    stats.var_error = torch::zeros_like(stats.var);
  }
  stats.invstd = (stats.var + kEps).rsqrt();
  // 1 / sqrt(v + eps): half v's relative error, plus the addition, the square root and the
  // division (or a 2-ulp rsqrt): 4 u.
  stats.invstd_relative_error = 0.5 * stats.var_error / (stats.var + kEps) + 4 * u;
  return stats;
}

void check_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  const Inputs inputs = make_inputs(c);
  const Results fused = run_fused(c, inputs);
  const Results unfused = run_unfused(c, inputs, fused.output);
  const Statistics stats = exact_statistics(c, inputs);
  const double u = kFloat32Roundoff;
  const double u_t = unit_roundoff(c.dtype);
  const int64_t rows = c.sizes[0] * c.sizes[2] * c.sizes[3];
  const double gamma = gamma_bound(rows);

  // Layout and dtype as ATen's.
  EXPECT_EQ(fused.output.scalar_type(), unfused.output.scalar_type());
  EXPECT_EQ(fused.output.strides(), inputs.input.strides());

  // Saved statistics: against float64, and against ATen's (training only: cuDNN saves none in
  // evaluation).
  {
    const FusedBatchNormReluForward forward = fused_batch_norm_relu_forward(
        inputs.input,
        inputs.residual,
        inputs.weight,
        inputs.bias,
        inputs.running_mean.clone(),
        inputs.running_var.clone(),
        c.training,
        kMomentum,
        kEps);
    EXPECT_TRUE(torch::equal(forward.output, fused.output)); // deterministic
    const at::Tensor invstd_error = stats.invstd * stats.invstd_relative_error;
    if (c.training) {
      const auto aten = at::_batch_norm_impl_index(
          inputs.input,
          inputs.weight,
          inputs.bias,
          inputs.running_mean.clone(),
          inputs.running_var.clone(),
          true,
          kMomentum,
          kEps,
          at::globalContext().userEnabledCuDNN());
      expect_near_both(
          forward.save_mean, std::get<1>(aten), stats.mean, stats.mean_error, "save_mean");
      expect_near_both(
          forward.save_invstd, std::get<2>(aten), stats.invstd, invstd_error, "save_invstd");
    } else {
      expect_within(forward.save_mean, stats.mean, stats.mean_error, "save_mean vs float64");
      expect_within(forward.save_invstd, stats.invstd, invstd_error, "save_invstd vs float64");
    }
  }

  // Running statistics: momentum times the batch statistic's error (the variance's scaled by
  // M / (M - 1)), and 4 u of each term for the update's arithmetic.
  if (c.training) {
    const double unbias = static_cast<double>(rows) / static_cast<double>(rows - 1);
    const at::Tensor old_mean = inputs.running_mean.to(at::kDouble);
    const at::Tensor old_var = inputs.running_var.to(at::kDouble);
    expect_near_both(
        fused.running_mean,
        unfused.running_mean,
        (1 - kMomentum) * old_mean + kMomentum * stats.mean,
        kMomentum * stats.mean_error + 4 * u * (old_mean.abs() + stats.mean.abs()),
        "running_mean");
    expect_near_both(
        fused.running_var,
        unfused.running_var,
        (1 - kMomentum) * old_var + kMomentum * unbias * stats.var,
        kMomentum * unbias * stats.var_error + 4 * u * (old_var + unbias * stats.var),
        "running_var");
  } else {
    EXPECT_TRUE(torch::equal(fused.running_mean, inputs.running_mean));
    EXPECT_TRUE(torch::equal(fused.running_var, inputs.running_var));
  }

  // Output: z = (x - mean) * invstd * w + b, exact in float64 from the exact statistics; one
  // side's error:
  //   |w| invstd (mean_error + |x - mean| invstd_rel)                   its statistics
  //   + 4 u (|w| invstd (|x| + |mean|) + |b|)                           float32 arithmetic
  // (the |mean| term covers the form x * scale + shift, whose products cancel); and the
  // roundings to T: ATen's of z and of z + r, u_T (2 |z| + |r|) (the fused one's, of
  // z + r, is within it). ReLU is 1-Lipschitz: the bound holds after it.
  const at::Tensor x = inputs.input.to(at::kDouble);
  const at::Tensor w = per_channel(inputs.weight.to(at::kDouble));
  const at::Tensor b = per_channel(inputs.bias.to(at::kDouble));
  const at::Tensor mean = per_channel(stats.mean);
  const at::Tensor invstd = per_channel(stats.invstd);
  const at::Tensor mean_error = per_channel(stats.mean_error);
  const at::Tensor invstd_rel = per_channel(stats.invstd_relative_error);
  const at::Tensor centered = x - mean;
  const at::Tensor z = centered * invstd * w + b;
  const at::Tensor r = c.residual ? inputs.residual.to(at::kDouble) : torch::zeros_like(z);
  const at::Tensor scale = w.abs() * invstd;
  expect_near_both(
      fused.output,
      unfused.output,
      (z + r).relu(),
      scale * (mean_error + centered.abs() * invstd_rel) +
          4 * u * (scale * (x.abs() + mean.abs()) + b.abs()) + u_t * (2 * z.abs() + r.abs()),
      "output");
  const int64_t flips = ((fused.output > 0) != (unfused.output > 0)).sum().item<int64_t>();
  ::testing::Test::RecordProperty("relu_mask_differences", std::to_string(flips));

  // Gradients, given the same g = dy where y > 0 (exact in float64):
  //   S1 = sum g, S2 = sum g (x - mean); one side's error
  //   e1 = gamma sum|g|,  e2 = gamma sum|g (x - mean)| + mean_error sum|g| (its own mean)
  const at::Tensor fused_mask_grad =
      at::threshold_backward(inputs.grad_output, fused.output.detach(), 0);
  const at::Tensor g = fused_mask_grad.to(at::kDouble);
  const at::Tensor s1 = g.sum(kChannelDims);
  const at::Tensor s2 = (g * centered).sum(kChannelDims);
  const at::Tensor abs_g = g.abs().sum(kChannelDims);
  const at::Tensor e1 = gamma * abs_g;
  const at::Tensor e2 = gamma * (g * centered).abs().sum(kChannelDims) + stats.mean_error * abs_g;
  // grad_bias = S1; grad_weight = S2 invstd (+ its invstd's error and 2 u of rounding).
  expect_near_both(fused.grad_bias, unfused.grad_bias, s1, e1 + u * s1.abs(), "grad_bias");
  expect_near_both(
      fused.grad_weight,
      unfused.grad_weight,
      s2 * stats.invstd,
      e2 * stats.invstd + s2.abs() * stats.invstd * (stats.invstd_relative_error + 2 * u),
      "grad_weight");
  // grad_x = w invstd (g - S1 / M - (x - mean) invstd^2 S2 / M) in training (the statistics'
  // terms vanish in evaluation: w invstd g). One side's error, first order:
  //   |w| invstd invstd_rel |bracket|                                    its invstd
  //   + |w| invstd (e1 / M + |x - mean| invstd^2 (e2 + 2 invstd_rel |S2|) / M
  //                 + mean_error invstd^2 |S2| / M)                      its sums and statistics
  //   + 4 u |w| invstd (|g| + |S1| / M + |x - mean| invstd^2 |S2| / M)  float32 arithmetic
  //   + u_T |grad_x|                                                     the rounding to T
  const double m = static_cast<double>(rows);
  const at::Tensor s1_c = per_channel(s1);
  const at::Tensor s2_c = per_channel(s2);
  const at::Tensor e1_c = per_channel(e1);
  const at::Tensor e2_c = per_channel(e2);
  at::Tensor bracket = g;
  at::Tensor statistics_terms = torch::zeros_like(g);
  at::Tensor arithmetic = g.abs();
  if (c.training) {
    bracket = g - s1_c / m - centered * invstd.square() * s2_c / m;
    statistics_terms = e1_c / m +
                       centered.abs() * invstd.square() * (e2_c + 2 * invstd_rel * s2_c.abs()) / m +
                       mean_error * invstd.square() * s2_c.abs() / m;
    arithmetic = g.abs() + s1_c.abs() / m + centered.abs() * invstd.square() * s2_c.abs() / m;
  }
  const at::Tensor grad_input = w * invstd * bracket;
  expect_near_both(
      fused.grad_input,
      unfused.grad_input,
      grad_input,
      scale * (invstd_rel * bracket.abs() + statistics_terms) + 4 * u * scale * arithmetic +
          u_t * grad_input.abs(),
      "grad_input");
  // grad_residual = g on both sides: dy or 0, exact.
  if (c.residual) {
    EXPECT_TRUE(torch::equal(fused.grad_residual, unfused.grad_residual));
    EXPECT_TRUE(torch::equal(fused.grad_residual, fused_mask_grad));
  }
}

// 8x7x7 (392 rows, one chunk), C = 13 and 3 (no vector width divides them), C = 20 (float32's
// width 4 divides it, 8 does not), C = 2048 (several blocks across channels), 32x14x14 with
// C = 256, and 256x56x56 (802816 rows: ResNet-50's first stage at batch 256).
const std::vector<std::vector<int64_t>> kShapes = {
    {8, 64, 7, 7},
    {8, 13, 7, 7},
    {3, 3, 5, 5},
    {2, 20, 9, 9},
    {4, 2048, 7, 7},
    {32, 256, 14, 14},
    {256, 64, 56, 56}};

void check_dtype(at::ScalarType dtype) {
  for (const std::vector<int64_t>& sizes : kShapes) {
    for (const bool residual : {false, true}) {
      for (const bool training : {true, false}) {
        check_case({dtype, sizes, residual, training});
      }
    }
  }
}

TEST(BatchNormReluCuda, Float32MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_dtype(at::kFloat);
}

TEST(BatchNormReluCuda, BFloat16MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_dtype(at::kBFloat16);
}

TEST(BatchNormReluCuda, Float16MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_dtype(at::kHalf);
}

TEST(BatchNormReluCuda, OtherLayoutsAndDtypesRunAtensPathBitForBit) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  const auto on_gpu = torch::device(torch::kCUDA);
  const at::Tensor weight = torch::rand({16}, on_gpu) + 0.5;
  const at::Tensor bias = torch::randn({16}, on_gpu);
  const std::vector<at::Tensor> inputs = {
      torch::randn({4, 16, 6, 6}, on_gpu).to(at::kBFloat16), // NCHW
      torch::randn({4, 16, 6, 6}, on_gpu.dtype(at::kDouble))
          .contiguous(at::MemoryFormat::ChannelsLast)}; // float64
  for (const at::Tensor& given : inputs) {
    SCOPED_TRACE(c10::toString(given.scalar_type()));
    const at::Tensor residual = torch::randn_like(given);
    const at::Tensor w = given.scalar_type() == at::kDouble ? weight.to(at::kDouble) : weight;
    const at::Tensor b = given.scalar_type() == at::kDouble ? bias.to(at::kDouble) : bias;
    ASSERT_FALSE(uses_fused_batch_norm(given, residual, w, b, {}, {}));
    const at::Tensor input = given.clone().requires_grad_();
    const at::Tensor output = batch_norm_add_relu(input, residual, w, b, {}, {}, true, 0.1, 1e-5);
    const at::Tensor reference_input = given.clone().requires_grad_();
    const at::Tensor reference = (torch::batch_norm(
                                      reference_input,
                                      w,
                                      b,
                                      {},
                                      {},
                                      true,
                                      0.1,
                                      1e-5,
                                      at::globalContext().userEnabledCuDNN()) +
                                  residual)
                                     .relu();
    EXPECT_TRUE(torch::equal(output, reference));
    const at::Tensor dy = torch::randn_like(given);
    EXPECT_TRUE(torch::equal(
        torch::autograd::grad({output}, {input}, {dy})[0],
        torch::autograd::grad({reference}, {reference_input}, {dy})[0]));
  }
}

TEST(BatchNormReluCuda, GradientInAnotherLayoutAndRepeatedRunsGiveTheSameBits) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  const Case c{at::kBFloat16, {16, 64, 14, 14}, /*residual=*/true, /*training=*/true};
  const Inputs inputs = make_inputs(c);
  const Results first = run_fused(c, inputs);
  const Results second = run_fused(c, inputs);
  EXPECT_TRUE(torch::equal(first.output, second.output));
  EXPECT_TRUE(torch::equal(first.running_var, second.running_var));
  EXPECT_TRUE(torch::equal(first.grad_input, second.grad_input));
  EXPECT_TRUE(torch::equal(first.grad_weight, second.grad_weight));
  // The same gradient in NCHW strides, and a sum's expanded one.
  Inputs nchw = inputs;
  nchw.grad_output = inputs.grad_output.contiguous();
  ASSERT_NE(nchw.grad_output.strides(), inputs.grad_output.strides());
  const Results from_nchw = run_fused(c, nchw);
  EXPECT_TRUE(torch::equal(first.grad_input, from_nchw.grad_input));
  EXPECT_TRUE(torch::equal(first.grad_weight, from_nchw.grad_weight));
  EXPECT_TRUE(torch::equal(first.grad_residual, from_nchw.grad_residual));
  const at::Tensor input = inputs.input.clone().requires_grad_();
  batch_norm_relu(input, inputs.weight, inputs.bias, {}, {}, true, kMomentum, kEps)
      .sum()
      .backward();
  EXPECT_TRUE(input.grad().defined());
  EXPECT_TRUE(torch::isfinite(input.grad()).all().item<bool>());
}

} // namespace
} // namespace largo::kernels::batch_norm_relu_cuda_test
