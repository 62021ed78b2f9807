// The fused CUDA kernels of bias_gelu and add_layer_norm against ATen's unfused sequence on the
// same GPU and against the exact (float64) value, in float32, bfloat16 and float16 (and the
// mixed pairings a ViT under autocast makes), with CUDA autocast on and off, over shapes from a
// few rows to ViT-B's [16, 197, 768] and [16, 197, 3072], and feature counts no vector width
// divides: outputs, the dtype contract, and every gradient, within bounds derived from the
// dtypes and the reduction lengths (below), each side against float64 so that a failure says
// whose error exceeds its bound. Also: what the kernels do not take runs ATen's path bit for
// bit, a gradient in another layout is accepted, and two runs give the same bits.
// Skipped without a GPU (scripts/gpu_check.sh runs them).
#include <largo/kernels/add_layer_norm.h>
#include <largo/kernels/batch_norm_relu.h> // cuda_kernels_compiled
#include <largo/kernels/bias_gelu.h>

#include "kernels/cuda_kernels_skip.h"
#include "kernels/kernel_test_bounds.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <string>

namespace largo::kernels::transformer_fusions_cuda_test {
namespace {

// ---- tolerances (kernel_test_bounds.h derives them) ----------------------------------------
// Sums of M float32 terms: a row's LayerNorm statistics (D = 768 terms) and the column sums of
// grad_bias / grad_weight (M = rows; gamma(M) fails with probability 1e-17 at M = 3152). The
// same model (independent rounding errors of mean zero) bounds a column sum of values that ATen
// rounded to T one by one, sum_i delta_i a_i with |delta_i| <= u_T, by Hoeffding's inequality:
// lambda u_T sqrt(sum a_i^2), failing with probability 2 exp(-lambda^2 / 2) (4e-22). The
// worst-case forms (M u, u_T sum |a_i|) would pass a kernel that drops a chunk of rows.
using test_bounds::expect_near_both;
using test_bounds::gamma_bound;
using test_bounds::kFloat32Roundoff;
using test_bounds::kLambda;
using test_bounds::unit_roundoff;

// CUDA autocast on in `dtype` for a scope (nullopt: off), the previous state restored after.
class CudaAutocast {
 public:
  explicit CudaAutocast(std::optional<at::ScalarType> dtype)
      : was_enabled_(at::autocast::is_autocast_enabled(at::kCUDA)),
        old_dtype_(at::autocast::get_autocast_dtype(at::kCUDA)) {
    at::autocast::set_autocast_enabled(at::kCUDA, dtype.has_value());
    if (dtype) {
      at::autocast::set_autocast_dtype(at::kCUDA, *dtype);
    }
  }
  ~CudaAutocast() {
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, old_dtype_);
    at::autocast::clear_cache();
  }
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;

 private:
  bool was_enabled_;
  at::ScalarType old_dtype_;
};

const auto kOnGpu = torch::device(torch::kCUDA);

// All dimensions but the last: the rows a per-feature gradient sums over.
std::vector<int64_t> row_dims(const at::Tensor& tensor) {
  std::vector<int64_t> dims(tensor.dim() - 1);
  for (int64_t i = 0; i < tensor.dim() - 1; ++i) {
    dims[i] = i;
  }
  return dims;
}

// ---- bias_gelu ----------------------------------------------------------------------------

struct GeluCase {
  at::ScalarType dtype;
  at::ScalarType bias_dtype;
  std::string approximate;
  std::vector<int64_t> sizes; // [..., N]
};

std::string describe(const GeluCase& c) {
  return std::string(c10::toString(c.dtype)) + " bias " + c10::toString(c.bias_dtype) + " " +
         c.approximate + " " + c10::str(at::IntArrayRef(c.sizes));
}

struct GeluResults {
  at::Tensor output;
  at::Tensor grad_input;
  at::Tensor grad_bias;
};

GeluResults run_gelu(
    const GeluCase& c,
    const at::Tensor& given_input,
    const at::Tensor& given_bias,
    const at::Tensor& dy,
    bool fused) {
  const at::Tensor input = given_input.clone().requires_grad_();
  const at::Tensor bias = given_bias.clone().requires_grad_();
  const at::Tensor output = fused ? bias_gelu(input, bias, c.approximate)
                                  : at::gelu(input + bias.to(c.dtype), c.approximate);
  const auto grads = torch::autograd::grad({output}, {input, bias}, {dy});
  return {output.detach(), grads[0], grads[1]};
}

// GELU and its first two derivatives in float64, of the formula `approximate` names.
struct GeluExact {
  at::Tensor value;
  at::Tensor first;
  at::Tensor second;
};

GeluExact exact_gelu(const at::Tensor& z, bool tanh) {
  GeluExact exact;
  if (!tanh) {
    const at::Tensor phi = (-0.5 * z.square()).exp() / std::sqrt(2.0 * M_PI);
    const at::Tensor cdf = 0.5 * (1.0 + (z * M_SQRT1_2).erf());
    exact.value = z * cdf;
    exact.first = cdf + z * phi;
    exact.second = phi * (2.0 - z.square());
    return exact;
  }
  const double c = std::sqrt(2.0 / M_PI);
  const double k = 0.044715;
  const at::Tensor p = 1.0 + 3.0 * k * z.square();
  const at::Tensor t = (c * (z + k * z.pow(3))).tanh();
  const at::Tensor s = 1.0 - t.square();
  const at::Tensor t_prime = s * c * p;
  const at::Tensor t_second = c * (-2.0 * t * t_prime * p + s * 6.0 * k * z);
  exact.value = 0.5 * z * (1.0 + t);
  exact.first = 0.5 * (1.0 + t) + 0.5 * z * t_prime;
  exact.second = t_prime + 0.5 * z * t_second;
  return exact;
}

// Bounds, one side, from the exact z = x + b (b as T rounds it: both sides add the same b):
//   z          ATen rounds it to T: |dz| <= u_T |z| (the fused side's float32 add: u |z|);
//   gelu(z)    in float32 from z: erf / tanh within 2 ulp (CUDA's erff, tanhf), their
//              argument's rounding (|erf'(w) w| <= 0.49, |tanh'(v) v| <= 0.45 times 5 u), 1 + erf
//              and the products: below 4.3 u |z| (+ u |y|), bounded by 8 u |z|;
//   y          |gelu'(z)| u_T |z| + 8 u |z| + u_T |y| (the rounding to T);
//   gelu'(z)   in float32: below 6.2 u for erf (phi's exp within 2 ulp, its argument's
//              rounding u z^2); for tanh (1 - t^2) is t's error of up to 14 u times
//              q(z) = |z| / 2 sqrt(2 / pi) (1 + 3 * 0.044715 z^2), cancelling where |z| is large;
//              plus z's error times |gelu''(z)|: 8 u [+ 16 u q(z)] + |gelu''(z)| u_T |z|;
//   grad_input dy gelu'(z): |dy| times the derivative's error + (u + u_T) |dx|;
//   grad_bias  sum over M rows of dx: the float32 errors per element summed (worst case, they
//              are tiny), the roundings to T per element (z's; ATen's of dx) by the Hoeffding
//              bound, the sum's own gamma(M) sum |dx|, and u_T |S| (ATen sums in T).
void check_gelu_case(const GeluCase& c) {
  SCOPED_TRACE(describe(c));
  torch::manual_seed(4344);
  const int64_t features = c.sizes.back();
  const at::Tensor input = (torch::randn(c.sizes, kOnGpu) * 2.0).to(c.dtype);
  const at::Tensor bias = (torch::randn({features}, kOnGpu) * 0.5).to(c.bias_dtype);
  const at::Tensor dy = torch::randn(c.sizes, kOnGpu).to(c.dtype);
  ASSERT_TRUE(uses_fused_bias_gelu(input, bias));
  const GeluResults fused = run_gelu(c, input, bias, dy, /*fused=*/true);
  const GeluResults aten = run_gelu(c, input, bias, dy, /*fused=*/false);
  EXPECT_EQ(fused.output.scalar_type(), aten.output.scalar_type());
  EXPECT_EQ(fused.grad_bias.scalar_type(), c.bias_dtype);

  const double u = kFloat32Roundoff;
  const double u_t = unit_roundoff(c.dtype);
  const bool tanh = c.approximate == "tanh";
  const at::Tensor z = input.to(at::kDouble) + bias.to(c.dtype).to(at::kDouble);
  const at::Tensor abs_z = z.abs();
  const GeluExact exact = exact_gelu(z, tanh);
  expect_near_both(
      fused.output,
      aten.output,
      exact.value,
      exact.first.abs() * u_t * abs_z + 8 * u * abs_z + u_t * exact.value.abs(),
      "output");

  const at::Tensor g = dy.to(at::kDouble);
  const at::Tensor dx = g * exact.first;
  at::Tensor float32_error = torch::full_like(z, 8 * u);
  if (tanh) {
    const double c_tanh = std::sqrt(2.0 / M_PI);
    float32_error = float32_error + 16 * u * 0.5 * abs_z * c_tanh * (1.0 + 0.134145 * z.square());
  }
  const at::Tensor z_rounding = exact.second.abs() * u_t * abs_z;
  expect_near_both(
      fused.grad_input,
      aten.grad_input,
      dx,
      g.abs() * (float32_error + z_rounding) + (u + u_t) * dx.abs(),
      "grad_input");

  const std::vector<int64_t> rows = row_dims(z);
  const int64_t m = z.numel() / features;
  const at::Tensor total = dx.sum(rows);
  const at::Tensor roundings =
      kLambda * ((g * z_rounding).square() + (u_t * dx).square()).sum(rows).sqrt();
  expect_near_both(
      fused.grad_bias,
      aten.grad_bias,
      total,
      (g.abs() * float32_error).sum(rows) + roundings + gamma_bound(m) * dx.abs().sum(rows) +
          u_t * total.abs(),
      "grad_bias");
}

// Shapes: a vector width divides 24 and 3072, none 13; [16, 197, 3072] is ViT-B's MLP at batch
// 16 (3152 rows: the column sums run in many chunks).
const std::vector<std::vector<int64_t>> kGeluShapes = {{2, 3, 24}, {5, 13}, {16, 197, 3072}};

void check_gelu_dtype(at::ScalarType dtype) {
  for (const at::ScalarType bias_dtype : {dtype, at::kFloat}) {
    for (const std::string approximate : {"none", "tanh"}) {
      for (const std::vector<int64_t>& sizes : kGeluShapes) {
        check_gelu_case({dtype, bias_dtype, approximate, sizes});
      }
    }
    if (dtype == at::kFloat) {
      break; // the float32 bias was the first
    }
  }
}

TEST(BiasGeluCuda, Float32MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_gelu_dtype(at::kFloat);
}

TEST(BiasGeluCuda, BFloat16MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_gelu_dtype(at::kBFloat16);
}

TEST(BiasGeluCuda, Float16MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_gelu_dtype(at::kHalf);
}

TEST(BiasGeluCuda, OtherLayoutsAndDtypesRunAtensPathBitForBit) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  const at::Tensor bias = torch::randn({16}, kOnGpu);
  const std::vector<at::Tensor> inputs = {
      torch::randn({16, 8}, kOnGpu).to(at::kBFloat16).t(), // not contiguous
      torch::randn({8, 16}, kOnGpu.dtype(at::kDouble))};   // float64
  for (const at::Tensor& given : inputs) {
    SCOPED_TRACE(c10::toString(given.scalar_type()));
    ASSERT_FALSE(uses_fused_bias_gelu(given, bias));
    const at::Tensor input = given.clone().requires_grad_();
    const at::Tensor reference_input = given.clone().requires_grad_();
    const at::Tensor output = bias_gelu(input, bias);
    const at::Tensor reference = at::gelu(reference_input + bias.to(given.scalar_type()));
    EXPECT_TRUE(torch::equal(output, reference));
    const at::Tensor dy = torch::randn_like(output);
    EXPECT_TRUE(torch::equal(
        torch::autograd::grad({output}, {input}, {dy})[0],
        torch::autograd::grad({reference}, {reference_input}, {dy})[0]));
  }
}

TEST(BiasGeluCuda, GradientInAnotherLayoutAndRepeatedRunsGiveTheSameBits) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  const GeluCase c{at::kBFloat16, at::kFloat, "none", {8, 197, 3072}};
  torch::manual_seed(4345);
  const at::Tensor input = torch::randn(c.sizes, kOnGpu).to(c.dtype);
  const at::Tensor bias = torch::randn({3072}, kOnGpu);
  const at::Tensor dy = torch::randn(c.sizes, kOnGpu).to(c.dtype);
  const GeluResults first = run_gelu(c, input, bias, dy, true);
  const GeluResults second = run_gelu(c, input, bias, dy, true);
  EXPECT_TRUE(torch::equal(first.output, second.output));
  EXPECT_TRUE(torch::equal(first.grad_input, second.grad_input));
  EXPECT_TRUE(torch::equal(first.grad_bias, second.grad_bias));
  // The same gradient with other strides (a transpose's), and a sum's expanded one.
  const at::Tensor transposed = dy.transpose(0, 1).contiguous().transpose(0, 1);
  ASSERT_NE(transposed.strides(), dy.strides());
  const GeluResults from_transposed = run_gelu(c, input, bias, transposed, true);
  EXPECT_TRUE(torch::equal(first.grad_input, from_transposed.grad_input));
  EXPECT_TRUE(torch::equal(first.grad_bias, from_transposed.grad_bias));
  const at::Tensor leaf = input.clone().requires_grad_();
  bias_gelu(leaf, bias).sum().backward();
  EXPECT_TRUE(torch::isfinite(leaf.grad()).all().item<bool>());
}

// ---- add_layer_norm -----------------------------------------------------------------------

constexpr double kEps = 1e-6; // the ViT's

struct LayerNormCase {
  at::ScalarType x;
  at::ScalarType residual;
  at::ScalarType parameters;
  std::optional<at::ScalarType> autocast; // CUDA autocast's dtype, or off
  std::vector<int64_t> sizes;             // [..., D]
  bool sum_gradient = true;               // whether a gradient reaches sum directly too
};

std::string describe(const LayerNormCase& c) {
  return std::string("x ") + c10::toString(c.x) + ", residual " + c10::toString(c.residual) +
         ", parameters " + c10::toString(c.parameters) + ", autocast " +
         (c.autocast ? c10::toString(*c.autocast) : "off") + " " +
         c10::str(at::IntArrayRef(c.sizes)) + (c.sum_gradient ? "" : ", no gradient of sum");
}

struct LayerNormInputs {
  at::Tensor x;        // a branch's output
  at::Tensor residual; // the residual stream: rows offset from 0, as a trained stream's are
  at::Tensor weight;
  at::Tensor bias;
  at::Tensor dy;   // float64, cast to output's dtype by each run
  at::Tensor dsum; // float64, cast to sum's dtype by each run; undefined: none
};

LayerNormInputs make_layer_norm_inputs(const LayerNormCase& c) {
  torch::manual_seed(4346);
  const int64_t features = c.sizes.back();
  std::vector<int64_t> row_sizes = c.sizes;
  row_sizes.back() = 1;
  LayerNormInputs inputs;
  inputs.x = (torch::randn(c.sizes, kOnGpu) * 0.5).to(c.x);
  inputs.residual =
      (torch::randn(c.sizes, kOnGpu) * 2.0 + torch::randn(row_sizes, kOnGpu) * 3.0).to(c.residual);
  inputs.weight = (torch::rand({features}, kOnGpu) + 0.5).to(c.parameters);
  inputs.bias = (torch::randn({features}, kOnGpu) * 0.1).to(c.parameters);
  inputs.dy = torch::randn(c.sizes, kOnGpu.dtype(at::kDouble));
  if (c.sum_gradient) {
    inputs.dsum = torch::randn(c.sizes, kOnGpu.dtype(at::kDouble));
  }
  return inputs;
}

struct LayerNormResults {
  at::Tensor sum;
  at::Tensor output;
  at::Tensor dy;   // as given, in output's dtype
  at::Tensor dsum; // as given, in sum's dtype, or undefined
  at::Tensor grad_x;
  at::Tensor grad_residual;
  at::Tensor grad_weight;
  at::Tensor grad_bias;
};

// The forward under the case's autocast state; the gradients outside it, as a training step's
// backward runs (on autograd's device thread, where autocast is off).
LayerNormResults run_layer_norm(const LayerNormCase& c, const LayerNormInputs& inputs, bool fused) {
  const at::Tensor x = inputs.x.clone().requires_grad_();
  const at::Tensor residual = inputs.residual.clone().requires_grad_();
  const at::Tensor weight = inputs.weight.clone().requires_grad_();
  const at::Tensor bias = inputs.bias.clone().requires_grad_();
  LayerNormResults run;
  {
    const CudaAutocast autocast(c.autocast);
    if (fused) {
      EXPECT_TRUE(uses_fused_add_layer_norm(x, residual, weight, bias));
      const AddLayerNormOutput result = add_layer_norm(x, residual, weight, bias, kEps);
      run.sum = result.sum;
      run.output = result.output;
    } else {
      run.sum = x + residual;
      run.output = at::layer_norm(run.sum, {c.sizes.back()}, weight, bias, kEps);
    }
  }
  run.dy = inputs.dy.to(run.output.scalar_type());
  std::vector<at::Tensor> roots = {run.output};
  std::vector<at::Tensor> grads = {run.dy};
  if (inputs.dsum.defined()) {
    run.dsum = inputs.dsum.to(run.sum.scalar_type());
    roots.push_back(run.sum);
    grads.push_back(run.dsum);
  }
  const auto leaves = torch::autograd::grad(roots, {x, residual, weight, bias}, grads);
  run.grad_x = leaves[0];
  run.grad_residual = leaves[1];
  run.grad_weight = leaves[2];
  run.grad_bias = leaves[3];
  run.sum = run.sum.detach();
  run.output = run.output.detach();
  return run;
}

// Bounds, one side, per row of D values of the sum s (both sides' s are equal, checked first):
//   mean, var    float32 sums of D terms: mean_error = gamma(D) mean|s| + u |mean|, var_error =
//                gamma(D) mean(s^2) + u var (the condition of E[s^2] - E[s]^2, which bounds
//                Welford's too);
//   rstd         relative: var_error / (2 (var + eps)) + 5 u (the add, sqrt and division, or a
//                2-ulp rsqrt);
//   xhat         rstd (mean_error + |s - mean| rstd_rel) + 2 u |xhat|;
//   output       |w| rstd (mean_error + |s - mean| rstd_rel) + 4 u (|w| rstd (|s| + |mean|)
//                + |b|) + u_O |y| (the rounding to the output's dtype);
// Backward, with dxhat = dy w, S1 = sum dxhat, S2 = sum dxhat xhat over the row:
//   e1 = (gamma(D) + u) sum |dxhat|, e2 = (gamma(D) + u) sum |dxhat xhat| + sum |dxhat| xhat_err;
//   ds_ln = rstd (dxhat - S1 / D - xhat S2 / D), ds = ds_ln + dsum:
//     rstd rstd_rel |bracket| + rstd (e1 / D + |xhat| e2 / D + xhat_err |S2| / D)
//     + 4 u rstd (|dxhat| + |S1| / D + |xhat| |S2| / D) + u_S (|ds_ln| + |ds|) + u |ds|
//     (ATen rounds ds_ln to the sum's dtype, then the sum with dsum; the fused side once);
//   grad_x, grad_residual: ds, + u_x |ds| where cast to a narrower dtype than the sum's;
//   grad_weight = sum over M rows of dy xhat: (gamma(M) + u) sum |dy xhat| + sum |dy| xhat_err
//     + u_W |grad_weight|;  grad_bias = sum dy: gamma(M) sum |dy| + u_W |grad_bias|.
void check_layer_norm_case(const LayerNormCase& c) {
  SCOPED_TRACE(describe(c));
  const LayerNormInputs inputs = make_layer_norm_inputs(c);
  const LayerNormResults fused = run_layer_norm(c, inputs, /*fused=*/true);
  const LayerNormResults aten = run_layer_norm(c, inputs, /*fused=*/false);

  // The dtype contract, and the sum bit for bit (the same add, the same rounding).
  const at::ScalarType sum_dtype = at::promote_types(c.x, c.residual);
  ASSERT_EQ(aten.sum.scalar_type(), sum_dtype);
  ASSERT_EQ(fused.sum.scalar_type(), sum_dtype);
  ASSERT_EQ(fused.output.scalar_type(), aten.output.scalar_type());
  EXPECT_EQ(fused.output.scalar_type(), c.autocast ? at::kFloat : sum_dtype);
  EXPECT_TRUE(torch::equal(fused.sum, aten.sum));
  EXPECT_EQ(fused.grad_x.scalar_type(), c.x);
  EXPECT_EQ(fused.grad_residual.scalar_type(), c.residual);
  EXPECT_EQ(fused.grad_weight.scalar_type(), c.parameters);

  const int64_t features = c.sizes.back();
  const double d = static_cast<double>(features);
  const double u = kFloat32Roundoff;
  const double gamma_d = gamma_bound(features);
  const at::Tensor s = fused.sum.to(at::kDouble).reshape({-1, features}); // [M, D]
  const int64_t m = s.size(0);
  const at::Tensor mean = s.mean(-1, true);
  const at::Tensor var = s.var(-1, /*unbiased=*/false, /*keepdim=*/true);
  const at::Tensor rstd = (var + kEps).rsqrt();
  const at::Tensor mean_error = gamma_d * s.abs().mean(-1, true) + u * mean.abs();
  const at::Tensor var_error = gamma_d * s.square().mean(-1, true) + u * var;
  const at::Tensor rstd_rel = 0.5 * var_error / (var + kEps) + 5 * u;
  const at::Tensor centered = s - mean;
  const at::Tensor xhat = centered * rstd;
  const at::Tensor xhat_error =
      rstd * (mean_error + centered.abs() * rstd_rel) + 2 * u * xhat.abs();
  const at::Tensor w = inputs.weight.to(at::kDouble);
  const at::Tensor b = inputs.bias.to(at::kDouble);
  const at::Tensor y = xhat * w + b;
  const auto flat = [&](const at::Tensor& tensor) { return tensor.reshape({-1, features}); };
  expect_near_both(
      flat(fused.output),
      flat(aten.output),
      y,
      w.abs() * rstd * (mean_error + centered.abs() * rstd_rel) +
          4 * u * (w.abs() * rstd * (s.abs() + mean.abs()) + b.abs()) +
          unit_roundoff(fused.output.scalar_type()) * y.abs(),
      "output");

  // Backward from the same dy (and dsum), as given in their dtypes.
  EXPECT_TRUE(torch::equal(fused.dy, aten.dy));
  const at::Tensor g = flat(fused.dy).to(at::kDouble);
  const at::Tensor direct =
      fused.dsum.defined() ? flat(fused.dsum).to(at::kDouble) : torch::zeros_like(g);
  const at::Tensor dxhat = g * w;
  const at::Tensor s1 = dxhat.sum(-1, true);
  const at::Tensor s2 = (dxhat * xhat).sum(-1, true);
  const at::Tensor e1 = (gamma_d + u) * dxhat.abs().sum(-1, true);
  const at::Tensor e2 =
      (gamma_d + u) * (dxhat * xhat).abs().sum(-1, true) + (dxhat.abs() * xhat_error).sum(-1, true);
  const at::Tensor bracket = dxhat - s1 / d - xhat * s2 / d;
  const at::Tensor ds_ln = rstd * bracket;
  const at::Tensor ds = ds_ln + direct;
  const double u_s = unit_roundoff(sum_dtype);
  const at::Tensor ds_bound =
      rstd * rstd_rel * bracket.abs() +
      rstd * (e1 / d + xhat.abs() * e2 / d + xhat_error * s2.abs() / d) +
      4 * u * rstd * (dxhat.abs() + s1.abs() / d + xhat.abs() * s2.abs() / d) +
      u_s * (ds_ln.abs() + ds.abs()) + u * ds.abs();
  for (const auto& [grad_fused, grad_aten, dtype, name] :
       {std::tuple{fused.grad_x, aten.grad_x, c.x, "grad_x"},
        std::tuple{fused.grad_residual, aten.grad_residual, c.residual, "grad_residual"}}) {
    const double cast = dtype == sum_dtype ? 0.0 : unit_roundoff(dtype);
    expect_near_both(flat(grad_fused), flat(grad_aten), ds, ds_bound + cast * ds.abs(), name);
  }
  const double u_w = unit_roundoff(c.parameters);
  const at::Tensor grad_weight = (g * xhat).sum(0);
  const at::Tensor grad_bias = g.sum(0);
  expect_near_both(
      fused.grad_weight,
      aten.grad_weight,
      grad_weight,
      (gamma_bound(m) + u) * (g * xhat).abs().sum(0) + (g.abs() * xhat_error).sum(0) +
          u_w * grad_weight.abs(),
      "grad_weight");
  expect_near_both(
      fused.grad_bias,
      aten.grad_bias,
      grad_bias,
      gamma_bound(m) * g.abs().sum(0) + u_w * grad_bias.abs(),
      "grad_bias");
}

// D = 32 (every vector width divides it), 13 (none), 1000 (not a power of two), and ViT-B's
// [16, 197, 768].
const std::vector<std::vector<int64_t>> kLayerNormShapes = {
    {2, 5, 32}, {3, 7, 13}, {4, 50, 1000}, {16, 197, 768}};

void check_layer_norm_cases(const std::vector<LayerNormCase>& cases) {
  for (const LayerNormCase& given : cases) {
    for (const std::vector<int64_t>& sizes : kLayerNormShapes) {
      LayerNormCase c = given;
      c.sizes = sizes;
      check_layer_norm_case(c);
    }
  }
}

const at::ScalarType kF = at::kFloat;
const at::ScalarType kB = at::kBFloat16;
const at::ScalarType kH = at::kHalf;

TEST(AddLayerNormCuda, Float32MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_layer_norm_cases({{kF, kF, kF, std::nullopt, {}}, {kF, kF, kF, kB, {}}});
}

TEST(AddLayerNormCuda, BFloat16MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_layer_norm_cases({
      {kB, kB, kF, std::nullopt, {}},
      {kB, kB, kB, std::nullopt, {}},
      {kB, kB, kF, kB, {}}, // autocast: a float32 output
      {kB, kF, kF, std::nullopt, {}},
      {kF, kB, kF, std::nullopt, {}},
      {kB, kF, kF, kB, {}}, // a ViT block under autocast: bfloat16 branch, float32 stream
      {kB, kB, kF, kB, {}, /*sum_gradient=*/false},
  });
}

TEST(AddLayerNormCuda, Float16MatchesAtensUnfusedSequence) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  check_layer_norm_cases({
      {kH, kH, kF, std::nullopt, {}},
      {kH, kH, kH, std::nullopt, {}},
      {kH, kH, kF, kH, {}},
      {kH, kF, kF, std::nullopt, {}},
  });
}

TEST(AddLayerNormCuda, OtherLayoutsAndDtypesRunAtensPathBitForBit) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  const at::Tensor weight = torch::rand({16}, kOnGpu) + 0.5;
  const at::Tensor bias = torch::randn({16}, kOnGpu);
  const std::vector<std::pair<at::Tensor, at::Tensor>> pairs = {
      {torch::randn({16, 8}, kOnGpu).t(), torch::randn({8, 16}, kOnGpu)}, // not contiguous
      {torch::randn({8, 16}, kOnGpu.dtype(at::kDouble)),
       torch::randn({8, 16}, kOnGpu.dtype(at::kDouble))},                            // float64
      {torch::randn({8, 16}, kOnGpu).to(kB), torch::randn({8, 16}, kOnGpu).to(kH)}}; // mixed
  for (const auto& [x, residual] : pairs) {
    SCOPED_TRACE(
        std::string(c10::toString(x.scalar_type())) + " + " +
        c10::toString(residual.scalar_type()));
    const at::Tensor w = x.scalar_type() == at::kDouble ? weight.to(at::kDouble) : weight;
    const at::Tensor b = x.scalar_type() == at::kDouble ? bias.to(at::kDouble) : bias;
    ASSERT_FALSE(uses_fused_add_layer_norm(x, residual, w, b));
    const at::Tensor leaf = x.clone().requires_grad_();
    const at::Tensor reference_leaf = x.clone().requires_grad_();
    const AddLayerNormOutput result = add_layer_norm(leaf, residual, w, b, kEps);
    const at::Tensor reference_sum = reference_leaf + residual;
    const at::Tensor reference = at::layer_norm(reference_sum, {16}, w, b, kEps);
    EXPECT_TRUE(torch::equal(result.sum, reference_sum));
    EXPECT_TRUE(torch::equal(result.output, reference));
    const at::Tensor dy = torch::randn_like(reference);
    EXPECT_TRUE(torch::equal(
        torch::autograd::grad({result.output}, {leaf}, {dy})[0],
        torch::autograd::grad({reference}, {reference_leaf}, {dy})[0]));
  }
}

TEST(AddLayerNormCuda, GradientInAnotherLayoutAndRepeatedRunsGiveTheSameBits) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  const LayerNormCase c{kB, kF, kF, kB, {16, 197, 768}};
  const LayerNormInputs inputs = make_layer_norm_inputs(c);
  const LayerNormResults first = run_layer_norm(c, inputs, true);
  const LayerNormResults second = run_layer_norm(c, inputs, true);
  EXPECT_TRUE(torch::equal(first.output, second.output));
  EXPECT_TRUE(torch::equal(first.grad_x, second.grad_x));
  EXPECT_TRUE(torch::equal(first.grad_weight, second.grad_weight));
  EXPECT_TRUE(torch::equal(first.grad_bias, second.grad_bias));
  // The same gradients with a transpose's strides.
  LayerNormInputs transposed = inputs;
  transposed.dy = inputs.dy.transpose(0, 1).contiguous().transpose(0, 1);
  transposed.dsum = inputs.dsum.transpose(0, 1).contiguous().transpose(0, 1);
  const LayerNormResults from_transposed = run_layer_norm(c, transposed, true);
  EXPECT_TRUE(torch::equal(first.grad_residual, from_transposed.grad_residual));
  EXPECT_TRUE(torch::equal(first.grad_weight, from_transposed.grad_weight));
  // A sum's expanded gradient, reaching only the output.
  const at::Tensor leaf = inputs.x.clone().requires_grad_();
  add_layer_norm(leaf, inputs.residual, inputs.weight, inputs.bias, kEps).output.sum().backward();
  EXPECT_TRUE(torch::isfinite(leaf.grad()).all().item<bool>());
}

} // namespace
} // namespace largo::kernels::transformer_fusions_cuda_test
