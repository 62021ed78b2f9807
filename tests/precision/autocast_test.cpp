// AutocastGuard on the CPU: bfloat16 matmuls/convolutions inside, float32 outside, nesting,
// and the weight-cast cache cleared when the outermost scope ends.
#include <largo/core/torch_compat.h>
#include <largo/precision/autocast.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::precision::autocast_test {
namespace {

TEST(AutocastGuard, CpuBfloat16ForMatmulAndConvOnly) {
  at::Tensor x = at::randn({2, 4});
  at::Tensor w = at::randn({3, 4});
  at::Tensor images = at::randn({1, 2, 5, 5});
  at::Tensor kernel = at::randn({3, 2, 3, 3});
  {
    AutocastGuard autocast(c10::kCPU, at::kBFloat16);
    at::Tensor y = at::linear(x, w);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    // Same values as casting by hand: autocast casts the inputs, then runs the bf16 kernel.
    EXPECT_TRUE(torch::equal(y, at::linear(x.to(at::kBFloat16), w.to(at::kBFloat16))));
    EXPECT_EQ(at::conv2d(images, kernel).scalar_type(), at::kBFloat16);
    EXPECT_EQ((x + x).scalar_type(), at::kFloat); // elementwise ops are not in the lists
  }
  EXPECT_EQ(at::linear(x, w).scalar_type(), at::kFloat);
  EXPECT_FALSE(compat::is_autocast_enabled(c10::kCPU));
}

TEST(AutocastGuard, NestedScopesRestoreWhatTheyFound) {
  at::Tensor x = at::randn({2, 4});
  at::Tensor w = at::randn({3, 4});
  const at::ScalarType dtype_before = compat::get_autocast_dtype(c10::kCPU);
  {
    AutocastGuard outer(c10::kCPU, at::kBFloat16);
    {
      AutocastGuard float32_region(c10::kCPU, at::kBFloat16, /*enabled=*/false);
      EXPECT_EQ(at::linear(x, w).scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(compat::is_autocast_enabled(c10::kCPU));
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(compat::is_autocast_enabled(c10::kCPU));
  EXPECT_EQ(compat::get_autocast_dtype(c10::kCPU), dtype_before);
}

TEST(AutocastGuard, OutermostScopeDropsCachedWeightCasts) {
  // Autocast caches the bf16 copy of a leaf that requires grad (a weight) for the scope;
  // a later scope must see the weight's new values.
  at::Tensor x = at::ones({1, 4});
  at::Tensor w = at::ones({2, 4}).requires_grad_(true);
  at::Tensor first;
  at::Tensor second;
  {
    AutocastGuard autocast(c10::kCPU, at::kBFloat16);
    first = at::linear(x, w).detach();
  }
  {
    torch::NoGradGuard no_grad;
    w.mul_(2.0);
  }
  {
    AutocastGuard autocast(c10::kCPU, at::kBFloat16);
    second = at::linear(x, w).detach();
  }
  EXPECT_EQ(first[0][0].item<float>(), 4.0f);
  EXPECT_EQ(second[0][0].item<float>(), 8.0f);
}

TEST(AutocastGuard, ModulesRunUnderIt) {
  torch::nn::Linear linear(4, 3);
  at::Tensor x = at::randn({2, 4});
  AutocastGuard autocast(c10::kCPU, at::kBFloat16);
  at::Tensor y = linear(x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  y.to(at::kFloat).sum().backward();
  // Gradients flow back to the float32 weights in float32.
  EXPECT_EQ(linear->weight.grad().scalar_type(), at::kFloat);
}

TEST(AutocastGuard, CudaFloat16AndBfloat16) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  at::Tensor x = at::randn({2, 4}, at::kCUDA);
  at::Tensor w = at::randn({3, 4}, at::kCUDA);
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    {
      AutocastGuard autocast(c10::kCUDA, dtype);
      EXPECT_EQ(at::linear(x, w).scalar_type(), dtype);
      EXPECT_EQ(at::log_softmax(at::linear(x, w), 1).scalar_type(), at::kFloat);
      // The CPU switch is separate: CPU ops are not affected.
      EXPECT_EQ(at::linear(x.cpu(), w.cpu()).scalar_type(), at::kFloat);
    }
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kFloat);
  }
}

} // namespace
} // namespace largo::precision::autocast_test
