// The rounding-error bounds and comparisons the fused kernels' CUDA tests share.
//
// Every bound is first-order in the unit roundoffs: u = 2^-24 (float32: both sides' arithmetic,
// statistics and sums) and u_T of a tensor's dtype T (2^-24 float32, 2^-8 bfloat16, 2^-11
// float16), which both sides round their results to.
//
// Reductions of M float32 terms use Higham & Mary's probabilistic bound ("A new approach to
// probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019, Thm. 2.4): for any order
// of summation, |computed - exact| <= gamma(M) * sum |terms| with
//   gamma(M) = exp(lambda * sqrt(M) * u + M * u^2 / (1 - u)) - 1   (about lambda sqrt(M) u),
// failing with probability at most 2 M exp(-lambda^2 (1 - u)^2 / 2) (3e-16 for M = 802816 at
// lambda = 10). The worst-case bound (M u) would pass a kernel that drops a chunk of rows, and
// ATen's reduction order (cuDNN's or its own) is unknown: this bound holds for any order. Each
// implementation is within its bound of the exact float64 value, so the two differ by at most
// twice it.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace largo::kernels::test_bounds {

constexpr double kLambda = 10.0;
constexpr double kFloat32Roundoff = 0x1p-24;

inline double gamma_bound(int64_t terms) {
  const double n = static_cast<double>(terms);
  const double u = kFloat32Roundoff;
  return std::expm1(kLambda * std::sqrt(n) * u + n * u * u / (1.0 - u));
}

inline double unit_roundoff(at::ScalarType type) {
  switch (type) {
  case at::kBFloat16:
    return 0x1p-8;
  case at::kHalf:
    return 0x1p-11;
  default:
    return kFloat32Roundoff;
  }
}

// Expects |actual - expected| <= tolerance elementwise (all float64 after conversion), and
// prints the worst element's ratio of error to tolerance.
inline void expect_within(
    const at::Tensor& actual,
    const at::Tensor& expected,
    const at::Tensor& tolerance,
    const std::string& what) {
  const at::Tensor error = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs();
  const at::Tensor allowed = tolerance.to(at::kDouble).expand_as(error);
  const at::Tensor over = error > allowed;
  const int64_t count = over.sum().item<int64_t>();
  const double worst = (error / allowed.clamp_min(1e-300)).max().item<double>();
  EXPECT_EQ(count, 0) << what << ": " << count << " of " << error.numel()
                      << " elements beyond their bound; worst error / bound " << worst
                      << ", largest error " << error.max().item<double>();
  if (count == 0) {
    ::testing::Test::RecordProperty(what, std::to_string(worst));
  }
}

// The fused result against the exact float64 value within one implementation's bound (so that
// a failure says whose error it is), and against ATen's within twice it.
inline void expect_near_both(
    const at::Tensor& fused,
    const at::Tensor& aten,
    const at::Tensor& exact,
    const at::Tensor& one_side_bound,
    const std::string& what) {
  expect_within(fused, exact, one_side_bound, what + " vs float64");
  expect_within(fused, aten, 2 * one_side_bound, what + " vs ATen");
}

} // namespace largo::kernels::test_bounds
