// batch_norm_relu / batch_norm_add_relu on the CPU: ATen's unfused sequence, bit for bit (the
// trunks' at::batch_norm, += residual, relu_), forward, running statistics and every gradient,
// in every layout and dtype; and the arguments both paths refuse, with the argument named.
// The fused CUDA kernels are compared with ATen in batch_norm_relu_cuda_test.cpp.
#include <largo/kernels/batch_norm_relu.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace largo::kernels::batch_norm_relu_test {
namespace {

struct Case {
  at::ScalarType dtype;
  bool channels_last;
  bool training;
  bool residual;
};

std::string describe(const Case& c) {
  return std::string(c10::toString(c.dtype)) + (c.channels_last ? " channels-last" : " NCHW") +
         (c.training ? " training" : " eval") + (c.residual ? " + residual" : "");
}

// Inputs of one case: x, residual in the case's dtype and layout; parameters and running
// statistics float32 (as autocast and the trunks' BatchNorm2d give them), float64 for float64.
struct Inputs {
  at::Tensor input;
  at::Tensor residual;
  at::Tensor weight;
  at::Tensor bias;
  at::Tensor running_mean;
  at::Tensor running_var;
  at::Tensor grad_output;
};

Inputs make_inputs(const Case& c, at::IntArrayRef sizes) {
  torch::manual_seed(43);
  const auto format =
      c.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const auto activations = [&](double scale, double offset) {
    return (torch::randn(sizes) * scale + offset).to(c.dtype).contiguous(format);
  };
  const int64_t channels = sizes[1];
  // ATen's CPU BatchNorm mixes only reduced-precision activations with float32 parameters.
  const auto parameters = torch::dtype(c.dtype == at::kDouble ? at::kDouble : at::kFloat);
  Inputs inputs;
  inputs.input = activations(2.0, 0.5);
  inputs.residual = c.residual ? activations(1.0, 0.0) : at::Tensor();
  inputs.weight = torch::rand({channels}, parameters) + 0.5;
  inputs.bias = torch::randn({channels}, parameters) * 0.1;
  inputs.running_mean = torch::randn({channels}, parameters) * 0.1;
  inputs.running_var = torch::rand({channels}, parameters) + 0.5;
  inputs.grad_output = activations(1.0, 0.0);
  return inputs;
}

struct Results {
  at::Tensor output;
  at::Tensor running_mean;
  at::Tensor running_var;
  std::vector<at::Tensor> grads; // input, weight, bias[, residual]
};

constexpr double kMomentum = 0.1;
constexpr double kEps = 1e-5;

// `fused`: the function under test; else the unfused sequence written out here.
Results run(const Case& c, const Inputs& given, bool fused) {
  const at::Tensor input = given.input.clone().requires_grad_();
  const at::Tensor weight = given.weight.clone().requires_grad_();
  const at::Tensor bias = given.bias.clone().requires_grad_();
  const at::Tensor residual = c.residual ? given.residual.clone().requires_grad_() : at::Tensor();
  Results results;
  results.running_mean = given.running_mean.clone();
  results.running_var = given.running_var.clone();
  if (fused) {
    results.output = c.residual ? batch_norm_add_relu(
                                      input,
                                      residual,
                                      weight,
                                      bias,
                                      results.running_mean,
                                      results.running_var,
                                      c.training,
                                      kMomentum,
                                      kEps)
                                : batch_norm_relu(
                                      input,
                                      weight,
                                      bias,
                                      results.running_mean,
                                      results.running_var,
                                      c.training,
                                      kMomentum,
                                      kEps);
  } else {
    at::Tensor normalized = torch::batch_norm(
        input,
        weight,
        bias,
        results.running_mean,
        results.running_var,
        c.training,
        kMomentum,
        kEps,
        at::globalContext().userEnabledCuDNN());
    results.output = (c.residual ? normalized + residual : normalized).relu();
  }
  std::vector<at::Tensor> leaves = {input, weight, bias};
  if (c.residual) {
    leaves.push_back(residual);
  }
  results.grads = torch::autograd::grad({results.output}, leaves, {given.grad_output});
  return results;
}

TEST(BatchNormRelu, OnTheCpuIsAtensUnfusedSequenceBitForBit) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    for (const bool channels_last : {true, false}) {
      for (const bool training : {true, false}) {
        for (const bool residual : {false, true}) {
          const Case c{dtype, channels_last, training, residual};
          SCOPED_TRACE(describe(c));
          // C = 13: no vector width divides it; 4 x 13 x 5 x 7 as a small trunk's map.
          const Inputs inputs = make_inputs(c, {4, 13, 5, 7});
          ASSERT_FALSE(uses_fused_batch_norm(
              inputs.input,
              inputs.residual,
              inputs.weight,
              inputs.bias,
              inputs.running_mean,
              inputs.running_var));
          const Results fused = run(c, inputs, /*fused=*/true);
          const Results unfused = run(c, inputs, /*fused=*/false);
          EXPECT_TRUE(torch::equal(fused.output, unfused.output));
          EXPECT_EQ(fused.output.strides(), unfused.output.strides());
          EXPECT_TRUE(torch::equal(fused.running_mean, unfused.running_mean));
          EXPECT_TRUE(torch::equal(fused.running_var, unfused.running_var));
          ASSERT_EQ(fused.grads.size(), unfused.grads.size());
          for (size_t i = 0; i < fused.grads.size(); ++i) {
            SCOPED_TRACE("gradient " + std::to_string(i) + " (input, weight, bias, residual)");
            EXPECT_TRUE(torch::equal(fused.grads[i], unfused.grads[i]));
          }
          if (training) { // the running statistics moved
            EXPECT_FALSE(torch::equal(fused.running_mean, inputs.running_mean));
          }
        }
      }
    }
  }
}

TEST(BatchNormRelu, TrainsWithoutRunningStatisticsAsAten) {
  const at::Tensor input = torch::randn({2, 3, 4, 4}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor weight = torch::rand({3});
  const at::Tensor bias = torch::randn({3});
  const at::Tensor expected =
      torch::batch_norm(input, weight, bias, {}, {}, true, kMomentum, kEps, true).relu();
  EXPECT_TRUE(
      torch::equal(batch_norm_relu(input, weight, bias, {}, {}, true, kMomentum, kEps), expected));
}

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

TEST(BatchNormRelu, RefusesWhatBatchNormRefusesNamingTheArgument) {
  const at::Tensor input = torch::randn({2, 3, 4, 4});
  const at::Tensor weight = torch::ones({3});
  const at::Tensor bias = torch::zeros({3});
  const at::Tensor mean = torch::zeros({3});
  const at::Tensor var = torch::ones({3});
  expect_error(
      [&] {
        batch_norm_relu(torch::randn({2, 3, 4}), weight, bias, mean, var, true, 0.1, 1e-5);
      },
      {"batch_norm_relu", "input must be 4-D", "[2, 3, 4]"});
  expect_error(
      [&] { batch_norm_relu(input, torch::ones({4}), bias, mean, var, true, 0.1, 1e-5); },
      {"weight must be [C] = [3]", "got sizes [4]"});
  expect_error(
      [&] {
        batch_norm_relu(input, weight, bias, torch::zeros({2, 3}), var, true, 0.1, 1e-5);
      },
      {"running_mean must be [C] = [3]", "[2, 3]"});
  expect_error(
      [&] { batch_norm_relu(input, weight, bias, mean, {}, true, 0.1, 1e-5); },
      {"running_mean and running_var must be both defined", "running_var undefined"});
  expect_error(
      [&] { batch_norm_relu(input, weight, bias, {}, {}, false, 0.1, 1e-5); },
      {"training = false", "undefined"});
  expect_error(
      [&] {
        batch_norm_relu(torch::randn({1, 3, 1, 1}), weight, bias, mean, var, true, 0.1, 1e-5);
      },
      {"more than 1 value per channel", "[1, 3, 1, 1]"});
  expect_error(
      [&] {
        batch_norm_add_relu(
            input, torch::randn({2, 3, 4, 5}), weight, bias, mean, var, true, 0.1, 1e-5);
      },
      {"batch_norm_add_relu", "residual must have input's sizes", "[2, 3, 4, 5]"});
  expect_error(
      [&] { batch_norm_add_relu(input, {}, weight, bias, mean, var, true, 0.1, 1e-5); },
      {"batch_norm_add_relu: residual is undefined"});
  // The running statistics are untouched by a refused call.
  EXPECT_TRUE(torch::equal(mean, torch::zeros({3})));
  // One value per channel is fine in evaluation, as in ATen.
  EXPECT_NO_THROW(batch_norm_add_relu(
      torch::randn({1, 3, 1, 1}),
      torch::randn({1, 3, 1, 1}),
      weight,
      bias,
      mean,
      var,
      false,
      0.1,
      1e-5));
}

TEST(BatchNormRelu, FusedOnlyForCudaChannelsLastInputsOfItsDtypes) {
  const at::Tensor input = torch::randn({2, 8, 4, 4}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor weight = torch::ones({8});
  const at::Tensor bias = torch::zeros({8});
  // The CPU keeps ATen's path, whatever the build holds (the CUDA cases: BatchNormReluCuda).
  EXPECT_FALSE(uses_fused_batch_norm(input, {}, weight, bias, {}, {}));
  EXPECT_FALSE(uses_fused_batch_norm(input, input, weight, bias, {}, {}));
}

} // namespace
} // namespace largo::kernels::batch_norm_relu_test
