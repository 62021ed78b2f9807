// What the tensor-parallel suites (tensor_parallel_test.cpp, tensor_parallel_composition_test.cpp)
// share: the bounds of a float64 tensor-parallel run against the unsharded model, derived once
// here, the comparison that applies them, and the zoo models with a Linear head.
#pragma once

#include <largo/models/trunk_head_model.h>
#include <largo/models/vit.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>

namespace largo::parallel::testing {

// Bound on |sharded - unsharded| relative to the largest |unsharded| value of the tensor
// compared. Both run in float64 (unit roundoff u = 2^-53 = 1.1e-16) and differ only in the
// order of additions: each value is a sum of at most K = 64 products (mlp_dim; the batch sums
// are shorter), whose reordering changes it by at most K * u = 7e-15 of the sum of |terms|;
// through the ~30 chained operations of forward and backward (LayerNorm and softmax included)
// that is at most ~1e-12 of the values' scale. 1e-10 leaves a factor 100; a wrong slice, a
// missing or doubled reduction or a bias added twice changes values by a sizeable fraction of
// their scale (1e-2 to 1 when each was tried), 1e8 times more. The same bound holds for the
// losses of the training steps: the one parameter whose AdamW update is rounding noise (below)
// does not enter the loss.
constexpr double kRelativeTolerance = 1e-10;
constexpr double kUnitRoundoff = 1.1102230246251565e-16; // float64, 2^-53
constexpr double kDotLength = 64;                        // the longest sum of products
constexpr double kAdamEps = 1e-8;                        // AdamWOptions' default

// The gradient a step may carry as pure rounding noise where it is zero in exact arithmetic:
// the key part of qkv's bias (softmax ignores a shift of all of a query's logits, and q . b_k
// is such a shift), K * u of the gradient scale, which after clipping is at most max_norm.
inline double gradient_noise(double max_norm) {
  return kDotLength * kUnitRoundoff * max_norm;
}

// What the weights after `steps` AdamW steps at `lr` may differ by on top of
// kRelativeTolerance: AdamW divides by sqrt(v) + eps, so such a gradient does not keep a
// relative error; every step turns each side's noise into an update of up to lr * noise / eps
// (eps, not sqrt(v), dominates the denominator). Two noisy sides: steps * lr * 2 * noise /
// eps, ~3e-7 for 20 steps at 1e-2 and max_norm 1 (measured: 4e-12, only in the key bias),
// still 1e4 below the differences a sharding error gives.
inline double adamw_noise_bound(double max_norm, int steps, double lr) {
  return steps * lr * 2.0 * gradient_noise(max_norm) / kAdamEps;
}

inline void expect_close(
    const at::Tensor& actual,
    const at::Tensor& expected,
    const std::string& what,
    double absolute_slack = 0.0) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = expected.abs().max().item<double>();
  const double error = (actual - expected).abs().max().item<double>();
  EXPECT_LE(error, kRelativeTolerance * scale + absolute_slack)
      << what << ": max |difference| " << error << " at max |value| " << scale;
}

inline models::TrunkHeadModel with_linear_head(models::Trunk trunk, int64_t classes) {
  const int64_t features = trunk.output_dim;
  return models::TrunkHeadModel(
      std::move(trunk), torch::nn::Sequential(torch::nn::Linear(features, classes)));
}

// A ViT small enough for many ranks' tests: two encoder layers of 4 heads (2 per rank at
// tensor-parallel size 2, 1 at 4) on 16x16 images of 8x8 patches, dropout 0 (the default),
// qkv's bias on so that it is sharded by heads too.
inline models::VitOptions small_vit_options() {
  models::VitOptions options;
  options.image_size = 16;
  options.patch_size = 8;
  options.num_layers = 2;
  options.num_heads = 4;
  options.hidden_dim = 32;
  options.mlp_dim = 64;
  options.qkv_bias = true;
  return options;
}

} // namespace largo::parallel::testing
