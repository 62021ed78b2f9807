// bias_gelu and add_layer_norm on the CPU: ATen's unfused sequence, bit for bit (at::gelu of
// input + bias cast to input's dtype; x + residual then at::layer_norm), outputs and every
// gradient, in every dtype pairing the fused kernels take and in float64; the arguments both
// paths refuse, with the argument named. The fused CUDA kernels are compared with ATen in
// transformer_fusions_cuda_test.cpp.
#include <largo/kernels/add_layer_norm.h>
#include <largo/kernels/bias_gelu.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace largo::kernels::transformer_fusions_test {
namespace {

// Expects `call` to throw c10::Error whose message holds every one of `parts`.
template <typename Call>
void expect_error(Call&& call, std::initializer_list<std::string> parts) {
  try {
    call();
    ADD_FAILURE() << "no error thrown";
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    }
  }
}

void expect_all_equal(
    const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    ASSERT_EQ(actual[i].defined(), expected[i].defined());
    if (actual[i].defined()) {
      EXPECT_EQ(actual[i].scalar_type(), expected[i].scalar_type());
      EXPECT_EQ(actual[i].strides(), expected[i].strides());
      EXPECT_TRUE(torch::equal(actual[i], expected[i]));
    }
  }
}

// ---- bias_gelu ----------------------------------------------------------------------------

// The output and the gradients of input and bias for grad_output `dy`; `fused`: the function
// under test, else the sequence written out.
std::vector<at::Tensor> run_bias_gelu(
    const at::Tensor& given_input,
    const at::Tensor& given_bias,
    const at::Tensor& dy,
    const std::string& approximate,
    bool fused) {
  const at::Tensor input = given_input.clone().requires_grad_();
  const at::Tensor bias = given_bias.clone().requires_grad_();
  const at::Tensor output = fused ? bias_gelu(input, bias, approximate)
                                  : at::gelu(input + bias.to(input.scalar_type()), approximate);
  std::vector<at::Tensor> results = torch::autograd::grad({output}, {input, bias}, {dy});
  results.insert(results.begin(), output.detach());
  return results;
}

TEST(BiasGelu, OnTheCpuIsAtensUnfusedSequenceBitForBit) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    for (const at::ScalarType bias_dtype : {dtype, at::kFloat}) {
      for (const std::string approximate : {"none", "tanh"}) {
        SCOPED_TRACE(
            std::string(c10::toString(dtype)) + " bias " + c10::toString(bias_dtype) + " " +
            approximate);
        torch::manual_seed(4302);
        // [batch, tokens, mlp_dim], mlp_dim 24 (a vector width divides it) and 13 (none does).
        for (const std::vector<int64_t>& sizes :
             {std::vector<int64_t>{3, 5, 24}, std::vector<int64_t>{7, 13}}) {
          const at::Tensor input = (torch::randn(sizes) * 2.0).to(dtype);
          const at::Tensor bias = torch::randn({sizes.back()}).to(bias_dtype);
          const at::Tensor dy = torch::randn(sizes).to(dtype);
          ASSERT_FALSE(uses_fused_bias_gelu(input, bias));
          expect_all_equal(
              run_bias_gelu(input, bias, dy, approximate, /*fused=*/true),
              run_bias_gelu(input, bias, dy, approximate, /*fused=*/false));
        }
      }
    }
  }
}

TEST(BiasGelu, WithBiasOfInputsDtypeIsGeluOfTheSum) {
  const at::Tensor input = torch::randn({4, 6, 16}).to(at::kBFloat16);
  const at::Tensor bias = torch::randn({16}).to(at::kBFloat16);
  EXPECT_TRUE(torch::equal(bias_gelu(input, bias), at::gelu(input + bias)));
  EXPECT_TRUE(torch::equal(bias_gelu(input, bias, "tanh"), at::gelu(input + bias, "tanh")));
  // A float32 bias (the model's parameter) gives input's dtype, as autocast's linear would.
  EXPECT_EQ(bias_gelu(input, bias.to(at::kFloat)).scalar_type(), at::kBFloat16);
}

TEST(BiasGelu, RefusesBadArgumentsNamingThem) {
  const at::Tensor input = torch::randn({2, 3, 8});
  const at::Tensor bias = torch::randn({8});
  expect_error([&] { bias_gelu(at::Tensor(), bias); }, {"bias_gelu: input is undefined"});
  expect_error([&] { bias_gelu(input, at::Tensor()); }, {"bias_gelu: bias is undefined"});
  expect_error([&] { bias_gelu(torch::tensor(1.0), bias); }, {"input must be [..., N]"});
  expect_error(
      [&] { bias_gelu(input, torch::randn({7})); },
      {"bias must be [N] = [8]", "[2, 3, 8]", "got sizes [7]"});
  expect_error([&] { bias_gelu(input, torch::randn({1, 8})); }, {"bias must be", "[1, 8]"});
  expect_error(
      [&] { bias_gelu(input, bias, "erf"); },
      {"approximate must be \"none\" or \"tanh\"", "got \"erf\""});
}

// ---- add_layer_norm -----------------------------------------------------------------------

struct LayerNormCase {
  at::ScalarType x;
  at::ScalarType residual;
  at::ScalarType parameters;
};

// sum, output, and the gradients of x, residual, weight and bias for gradients reaching both
// outputs (`dsum` may be undefined: only the LayerNorm's output is differentiated).
std::vector<at::Tensor> run_add_layer_norm(
    const LayerNormCase& c,
    const std::vector<int64_t>& sizes,
    const at::Tensor& dsum,
    const at::Tensor& dy,
    bool fused) {
  torch::manual_seed(4303);
  const int64_t features = sizes.back();
  const at::Tensor x = (torch::randn(sizes) * 0.5).to(c.x).requires_grad_();
  const at::Tensor residual = (torch::randn(sizes) * 2.0 + 1.0).to(c.residual).requires_grad_();
  const at::Tensor weight = (torch::rand({features}) + 0.5).to(c.parameters).requires_grad_();
  const at::Tensor bias = (torch::randn({features}) * 0.1).to(c.parameters).requires_grad_();
  constexpr double kEps = 1e-6; // the ViT's
  at::Tensor sum;
  at::Tensor output;
  if (fused) {
    const AddLayerNormOutput result = add_layer_norm(x, residual, weight, bias, kEps);
    sum = result.sum;
    output = result.output;
  } else {
    sum = x + residual;
    output = at::layer_norm(sum, {features}, weight, bias, kEps);
  }
  std::vector<at::Tensor> roots = {output};
  std::vector<at::Tensor> grads = {dy.to(output.scalar_type())};
  if (dsum.defined()) {
    roots.push_back(sum);
    grads.push_back(dsum.to(sum.scalar_type()));
  }
  std::vector<at::Tensor> results =
      torch::autograd::grad(roots, {x, residual, weight, bias}, grads);
  results.insert(results.begin(), {sum.detach(), output.detach()});
  return results;
}

TEST(AddLayerNorm, OnTheCpuIsAtensUnfusedSequenceBitForBit) {
  const at::ScalarType f = at::kFloat;
  const at::ScalarType b = at::kBFloat16;
  const at::ScalarType h = at::kHalf;
  const at::ScalarType d = at::kDouble;
  // The pairings the fused kernels take (a ViT under autocast: a bfloat16 branch output and a
  // float32 residual stream), with float32 and activation-dtype parameters, and float64.
  const std::vector<LayerNormCase> cases = {
      {f, f, f},
      {b, b, f},
      {b, b, b},
      {h, h, f},
      {h, h, h},
      {b, f, f},
      {f, b, f},
      {h, f, f},
      {d, d, d}};
  for (const LayerNormCase& c : cases) {
    SCOPED_TRACE(
        std::string("x ") + c10::toString(c.x) + ", residual " + c10::toString(c.residual) +
        ", parameters " + c10::toString(c.parameters));
    // [batch, tokens, hidden]: hidden 32 (vector widths divide it) and 13 (none does).
    for (const std::vector<int64_t>& sizes :
         {std::vector<int64_t>{2, 5, 32}, std::vector<int64_t>{6, 13}}) {
      const at::Tensor dy = torch::randn(sizes, torch::kDouble);
      const at::Tensor dsum = torch::randn(sizes, torch::kDouble);
      expect_all_equal(
          run_add_layer_norm(c, sizes, dsum, dy, /*fused=*/true),
          run_add_layer_norm(c, sizes, dsum, dy, /*fused=*/false));
      // Only the LayerNorm's output differentiated: x's gradient is the LayerNorm's alone.
      expect_all_equal(
          run_add_layer_norm(c, sizes, at::Tensor(), dy, /*fused=*/true),
          run_add_layer_norm(c, sizes, at::Tensor(), dy, /*fused=*/false));
    }
  }
}

TEST(AddLayerNorm, NotFusedOnTheCpu) {
  const at::Tensor x = torch::randn({2, 4, 8});
  const at::Tensor weight = torch::ones({8});
  const at::Tensor bias = torch::zeros({8});
  EXPECT_FALSE(uses_fused_add_layer_norm(x, x, weight, bias));
  EXPECT_FALSE(uses_fused_bias_gelu(x, bias));
  // Undefined parameters take ATen's path (as at::layer_norm takes them).
  const AddLayerNormOutput result = add_layer_norm(x, x, at::Tensor(), at::Tensor(), 1e-5);
  EXPECT_TRUE(torch::equal(result.output, at::layer_norm(x + x, {8}, {}, {}, 1e-5)));
}

TEST(AddLayerNorm, RefusesBadArgumentsNamingThem) {
  const at::Tensor x = torch::randn({2, 3, 8});
  const at::Tensor weight = torch::ones({8});
  const at::Tensor bias = torch::zeros({8});
  expect_error(
      [&] { add_layer_norm(at::Tensor(), x, weight, bias, 1e-5); },
      {"add_layer_norm: x is undefined"});
  expect_error(
      [&] { add_layer_norm(x, at::Tensor(), weight, bias, 1e-5); },
      {"add_layer_norm: residual is undefined"});
  expect_error(
      [&] { add_layer_norm(torch::tensor(1.0), torch::tensor(1.0), weight, bias, 1e-5); },
      {"x must be [..., D]"});
  expect_error(
      [&] {
        add_layer_norm(x, torch::randn({2, 1, 8}), weight, bias, 1e-5);
      },
      {"residual must have x's sizes [2, 3, 8]", "got [2, 1, 8]"});
  expect_error(
      [&] { add_layer_norm(x, x, torch::ones({7}), bias, 1e-5); },
      {"weight must be [D] = [8]", "got sizes [7]"});
  expect_error(
      [&] {
        add_layer_norm(x, x, weight, torch::zeros({2, 8}), 1e-5);
      },
      {"bias must be [D] = [8]", "got sizes [2, 8]"});
}

} // namespace
} // namespace largo::kernels::transformer_fusions_test
