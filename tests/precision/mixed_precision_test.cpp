// MixedPrecision: a policy applied to a model through the calls a training loop makes:
// forward / backward / unscale_ / step, skipped steps, the no-scaler inf/NaN check, O2's
// masters, and a state round trip that continues bit for bit.
#include <largo/core/error.h>
#include <largo/precision/mixed_precision.h>
#include <largo/precision/tf32.h>
#include <largo/core/torch_compat.h>

#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <iostream>
#include <limits>
#include <utility>

namespace largo::precision::mixed_precision_test {
namespace {

torch::nn::Sequential small_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1).bias(false)),
      torch::nn::BatchNorm2d(4), torch::nn::ReLU(), torch::nn::Flatten(),
      torch::nn::Linear(4 * 6 * 6, 3));
}

PrecisionPolicy policy_for(const std::string& level, const std::string& dtype = "bfloat16",
                           std::optional<std::string> loss_scale = std::nullopt) {
  PrecisionPolicyOptions options;
  options.use_amp = level != "off";
  options.opt_level = level == "off" ? "O1" : level;
  options.dtype = dtype;
  options.loss_scale = loss_scale;
  return resolve_precision_policy(options);
}

// The optimizer's parameters: the masters under O2, the model's parameters otherwise.
std::vector<at::Tensor> optimizer_params(const MixedPrecision& precision,
                                         torch::nn::Module& model) {
  std::vector<at::Tensor> params;
  for (const auto& item : model.named_parameters()) {
    params.push_back(precision.optimizer_param(item.key(), item.value()));
  }
  return params;
}

struct TrainingRun {
  torch::nn::Sequential model = small_model();
  std::unique_ptr<MixedPrecision> precision;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::SGD> optimizer;

  explicit TrainingRun(const PrecisionPolicy& policy, GradScalerOptions scaler = {}) {
    precision = std::make_unique<MixedPrecision>(policy, *model, c10::Device(c10::kCPU), scaler);
    params = optimizer_params(*precision, *model);
    optimizer = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05));
  }

  // One training step; `poison` writes NaN into the first parameter's gradient.
  bool step(const at::Tensor& images, const at::Tensor& labels, bool poison = false) {
    optimizer->zero_grad();
    at::Tensor logits =
        precision->forward([&](const at::Tensor& x) { return model->forward(x); }, images);
    EXPECT_EQ(logits.scalar_type(), at::kFloat);
    precision->backward(torch::nn::functional::cross_entropy(logits, labels));
    if (poison) {
      model->parameters()[0].mutable_grad().view({-1})[0].fill_(
          std::numeric_limits<float>::quiet_NaN());
    }
    const bool finite = precision->unscale_(params);
    EXPECT_EQ(finite, !poison);
    return precision->step([&] { optimizer->step(); });
  }
};

at::Tensor batch_images() {
  torch::manual_seed(1);
  return at::randn({8, 1, 6, 6});
}
at::Tensor batch_labels() {
  return at::arange(8) % 3;
}

TEST(MixedPrecision, Float32PolicyIsPlainTraining) {
  TrainingRun run(policy_for("off"));
  EXPECT_FALSE(run.precision->has_loss_scaling());
  EXPECT_EQ(run.precision->loss_scale(), 1.0);
  // The same step by hand.
  auto reference = small_model();
  torch::optim::SGD optimizer(reference->parameters(), torch::optim::SGDOptions(0.05));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(run.step(batch_images(), batch_labels()));
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(batch_images()), batch_labels())
        .backward();
    optimizer.step();
  }
  for (size_t i = 0; i < run.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(run.params[i], reference->parameters()[i]));
  }
}

TEST(MixedPrecision, WithoutAScalerANonFiniteGradientIsReportedNotSkipped) {
  TrainingRun run(policy_for("O1")); // bfloat16: no loss scaling
  ASSERT_FALSE(run.precision->has_loss_scaling());
  EXPECT_TRUE(run.step(batch_images(), batch_labels()));
  auto before = run.params[0].clone();
  // The caller (the trainer) stops the run when unscale_ says false; a step anyway is skipped.
  EXPECT_FALSE(run.step(batch_images(), batch_labels(), /*poison=*/true));
  EXPECT_TRUE(torch::equal(run.params[0], before));
}

TEST(MixedPrecision, O1RunsMatmulsInBfloat16WithFloat32Weights) {
  TrainingRun run(policy_for("O1"));
  for (const auto& param : run.model->parameters()) {
    EXPECT_EQ(param.scalar_type(), at::kFloat);
  }
  at::Tensor images = batch_images();
  at::Tensor logits =
      run.precision->forward([&](const at::Tensor& x) { return run.model->forward(x); }, images);
  EXPECT_EQ(logits.scalar_type(), at::kFloat); // cast back for the loss
  at::Tensor float32_logits = run.model->forward(images);
  // Not bitwise equal to float32 (the convolution and linear ran in bfloat16) but close.
  EXPECT_FALSE(torch::equal(logits, float32_logits));
  EXPECT_TRUE(torch::allclose(logits, float32_logits, /*rtol=*/0.05, /*atol=*/0.05));
}

TEST(MixedPrecision, O2TrainsFloat32MastersAndCopiesThemDown) {
  TrainingRun run(policy_for("O2"));
  const MasterWeights* masters = run.precision->master_weights();
  ASSERT_NE(masters, nullptr);
  auto named = run.model->named_parameters();
  EXPECT_EQ(named["0.weight"].scalar_type(), at::kBFloat16);
  EXPECT_EQ(named["1.weight"].scalar_type(), at::kFloat); // BatchNorm
  for (const auto& param : run.params) {
    EXPECT_EQ(param.scalar_type(), at::kFloat) << "the optimizer sees float32 masters";
  }
  for (int i = 0; i < 3; ++i) {
    at::Tensor master_before = masters->master("4.weight").clone();
    EXPECT_TRUE(run.step(batch_images(), batch_labels()));
    EXPECT_FALSE(torch::equal(masters->master("4.weight"), master_before));
    for (const auto& item : named) {
      EXPECT_TRUE(torch::equal(item.value(),
                               masters->master(item.key()).to(item.value().scalar_type())))
          << item.key();
    }
  }
}

TEST(MixedPrecision, DynamicScalingSkipsPoisonedStepsAndCountsThem) {
  TrainingRun run(policy_for("O2", "bfloat16", "dynamic"));
  ASSERT_TRUE(run.precision->has_loss_scaling());
  EXPECT_EQ(run.precision->loss_scale(), 65536.0);
  EXPECT_TRUE(run.step(batch_images(), batch_labels()));
  auto weights_before = run.model->named_parameters()["4.weight"].clone();
  auto masters_before = run.precision->master_weights()->master("4.weight").clone();
  EXPECT_FALSE(run.step(batch_images(), batch_labels(), /*poison=*/true));
  EXPECT_EQ(run.precision->skipped_steps(), 1);
  EXPECT_EQ(run.precision->loss_scale(), 32768.0);
  EXPECT_TRUE(torch::equal(run.model->named_parameters()["4.weight"], weights_before));
  EXPECT_TRUE(torch::equal(run.precision->master_weights()->master("4.weight"), masters_before));
  EXPECT_TRUE(run.step(batch_images(), batch_labels()));
  EXPECT_EQ(run.precision->skipped_steps(), 1);
}

TEST(MixedPrecision, ScaledAndUnscaledRunsTakeTheSameSteps) {
  // Loss scaling by a power of two is exact in float32: the unscaled gradients, and so the
  // updates, are bitwise those of the unscaled run (O1 bf16 with and without a scaler).
  TrainingRun plain(policy_for("O1"));
  GradScalerOptions scaler;
  scaler.init_scale = 1024.0;
  TrainingRun scaled(policy_for("O1", "bfloat16", "dynamic"), scaler);
  for (int i = 0; i < 3; ++i) {
    plain.step(batch_images(), batch_labels());
    scaled.step(batch_images(), batch_labels());
  }
  for (size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.params[i], scaled.params[i])) << i;
  }
}

TEST(MixedPrecision, ReducerSeesTheNoScalerCheckToo) {
  int calls = 0;
  GradScalerOptions options;
  options.found_inf_reducer = [&](at::Tensor& found_inf) {
    ++calls;
    found_inf.fill_(1.0f); // another rank found a NaN
  };
  auto model = small_model();
  MixedPrecision precision(policy_for("off"), *model, c10::Device(c10::kCPU), options);
  torch::nn::functional::cross_entropy(model->forward(batch_images()), batch_labels()).backward();
  EXPECT_FALSE(precision.unscale_(model->parameters()));
  EXPECT_EQ(calls, 1);
}

TEST(MixedPrecision, ANonFiniteLossHereReachesTheReducerWithOrWithoutAScaler) {
  // The trainer passes loss_is_finite = false instead of stopping on its own, so that the
  // other ranks (waiting in the all-reduce) stop or skip at the same step.
  for (const bool with_scaler : {false, true}) {
    float reduced = -1.0f;
    GradScalerOptions options;
    options.found_inf_reducer = [&](at::Tensor& found_inf) { reduced = found_inf.item<float>(); };
    auto model = small_model();
    MixedPrecision precision(policy_for("O1", "bfloat16",
                                        with_scaler ? std::optional<std::string>("dynamic")
                                                    : std::nullopt),
                             *model, c10::Device(c10::kCPU), options);
    ASSERT_EQ(precision.has_loss_scaling(), with_scaler);
    precision.backward(
        torch::nn::functional::cross_entropy(model->forward(batch_images()), batch_labels()));
    EXPECT_FALSE(precision.unscale_(model->parameters(), /*loss_is_finite=*/false))
        << "with_scaler " << with_scaler;
    EXPECT_EQ(reduced, 1.0f) << "with_scaler " << with_scaler;
    auto before = model->parameters()[0].clone();
    EXPECT_FALSE(precision.step([] { FAIL() << "the optimizer must not step"; }));
    EXPECT_TRUE(torch::equal(model->parameters()[0], before));
    EXPECT_EQ(precision.skipped_steps(), 1);
  }
}

TEST(MixedPrecision, StateRoundTripContinuesBitExactly) {
  GradScalerOptions scaler;
  scaler.growth_interval = 2;
  TrainingRun uninterrupted(policy_for("O2", "bfloat16", "dynamic"), scaler);
  TrainingRun first(policy_for("O2", "bfloat16", "dynamic"), scaler);
  for (int i = 0; i < 3; ++i) {
    uninterrupted.step(batch_images(), batch_labels(), /*poison=*/i == 1);
    first.step(batch_images(), batch_labels(), /*poison=*/i == 1);
  }
  // "Checkpoint": the model's own (bfloat16) weights and buffers, and the precision state,
  // pickled; then a fresh run loads them. (SGD without momentum has no state.)
  std::vector<char> precision_bytes = torch::pickle_save(first.precision->state_dict());
  std::vector<at::Tensor> model_state;
  for (const auto& tensor : first.model->parameters()) {
    model_state.push_back(tensor.detach().clone());
  }
  for (const auto& tensor : first.model->buffers()) {
    model_state.push_back(tensor.clone());
  }
  TrainingRun resumed(policy_for("O2", "bfloat16", "dynamic"), scaler);
  {
    torch::NoGradGuard no_grad;
    size_t k = 0;
    for (auto& tensor : resumed.model->parameters()) {
      tensor.copy_(model_state[k++]);
    }
    for (auto& tensor : resumed.model->buffers()) {
      tensor.copy_(model_state[k++]);
    }
  }
  resumed.precision->load_state_dict(torch::pickle_load(precision_bytes));
  EXPECT_EQ(resumed.precision->skipped_steps(), 1);
  EXPECT_EQ(resumed.precision->loss_scale(), first.precision->loss_scale());
  for (int i = 0; i < 4; ++i) {
    uninterrupted.step(batch_images(), batch_labels(), /*poison=*/i == 2);
    resumed.step(batch_images(), batch_labels(), /*poison=*/i == 2);
    ASSERT_EQ(resumed.precision->loss_scale(), uninterrupted.precision->loss_scale());
  }
  for (size_t i = 0; i < uninterrupted.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(uninterrupted.params[i], resumed.params[i])) << "master " << i;
  }
  auto expected = uninterrupted.model->named_parameters();
  for (const auto& item : resumed.model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), expected[item.key()])) << item.key();
  }
  EXPECT_EQ(resumed.precision->skipped_steps(), 2);
}

TEST(MixedPrecision, StateFromAFloat32RunStartsTheMastersFromTheModel) {
  TrainingRun run(policy_for("O2"));
  {
    torch::NoGradGuard no_grad;
    run.model->named_parameters()["4.weight"].fill_(0.5);
  }
  run.precision->load_state_dict(c10::IValue());
  EXPECT_TRUE(torch::equal(run.precision->master_weights()->master("4.weight"),
                           at::full({3, 144}, 0.5f)));
}

// float16 O1 (autocast) and O2 (float16 model, float32 master weights and BatchNorm) with the
// dynamic loss scaler train the small model on `device`: the loss falls, no step is skipped,
// and O2's model is the masters rounded to float16.
void expect_float16_o1_and_o2_train(const c10::Device& device) {
  for (const char* level : {"O1", "O2"}) {
    SCOPED_TRACE(level);
    auto model = small_model();
    model->to(device);
    MixedPrecision precision(policy_for(level, "float16"), *model, device);
    ASSERT_TRUE(precision.has_loss_scaling());
    std::vector<at::Tensor> params = optimizer_params(precision, *model);
    torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.05));
    at::Tensor images = batch_images().to(device);
    at::Tensor labels = batch_labels().to(device);
    float first_loss = 0;
    float last_loss = 0;
    for (int i = 0; i < 20; ++i) {
      optimizer.zero_grad();
      at::Tensor logits =
          precision.forward([&](const at::Tensor& x) { return model->forward(x); }, images);
      ASSERT_EQ(logits.scalar_type(), at::kFloat);
      at::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
      (i == 0 ? first_loss : last_loss) = loss.item<float>();
      precision.backward(loss);
      precision.unscale_(params);
      precision.step([&] { optimizer.step(); });
    }
    EXPECT_LT(last_loss, first_loss);
    EXPECT_EQ(precision.skipped_steps(), 0);
    if (const auto* masters = precision.master_weights()) {
      for (const auto& item : model->named_parameters()) {
        EXPECT_TRUE(torch::equal(item.value(),
                                 masters->master(item.key()).to(item.value().scalar_type())));
      }
      EXPECT_EQ(model->named_parameters()["0.weight"].scalar_type(), at::kHalf);
      EXPECT_EQ(model->named_parameters()["1.weight"].scalar_type(), at::kFloat);
    }
  }
}

TEST(MixedPrecision, Float16O1AndO2TrainOnTheCpu) {
  expect_float16_o1_and_o2_train(c10::Device(c10::kCPU));
}

TEST(MixedPrecision, CudaFloat16O1AndO2Train) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  expect_float16_o1_and_o2_train(c10::Device(c10::kCUDA, 0));
}

TEST(Tf32, SwitchesAreStoredAndHarmlessOnTheCpu) {
  apply_tf32({/*matmul=*/true, /*cudnn=*/false});
  EXPECT_TRUE(compat::allow_tf32_matmul());
  EXPECT_FALSE(compat::allow_tf32_cudnn());
  at::Tensor a = at::randn({4, 4});
  EXPECT_TRUE(torch::equal(at::mm(a, at::eye(4)), a)); // CPU matmuls stay float32
  apply_tf32({});
  EXPECT_FALSE(compat::allow_tf32_matmul());
  EXPECT_TRUE(compat::allow_tf32_cudnn());
}

// ||out - ref|| / ||ref|| with the reference in float64.
double relative_error(const at::Tensor& out, const at::Tensor& reference) {
  return (out.to(at::kDouble) - reference).norm().item<double>() / reference.norm().item<double>();
}

// The two switches change exactly their own kind of work on a GPU. A float32 matmul or
// convolution of K-term dot products accumulates rounding of about sqrt(K) * 2^-24 relative
// (K = 1024 here: ~2e-6; cuBLAS/cuDNN may split the sum, which only lowers it), so "true
// float32" is bounded by 1e-5. TF32 rounds each input to 10 mantissa bits (relative 2^-11 =
// 4.9e-4 each); with random inputs the errors of a product's two factors add in quadrature and
// average over the sum, so the result's relative error is of order 2^-11 (METHOD: ~3e-4):
// above 3e-5 (ten times the float32 bound's order, so "on" cannot pass as "off") and below
// 3e-3 (six times 2^-11).
TEST(Tf32, CudaSwitchesChangeMatmulsAndConvolutionsOnly) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(7);
  const at::Tensor a = at::randn({512, 1024}).to(cuda);
  const at::Tensor b = at::randn({1024, 512}).to(cuda);
  const at::Tensor mm_reference = at::mm(a.to(at::kDouble), b.to(at::kDouble));
  // 64 input channels x 4x4 kernel = 1024-term sums, as the matmul's.
  const at::Tensor images = at::randn({8, 64, 32, 32}).to(cuda);
  const at::Tensor weight = at::randn({128, 64, 4, 4}).to(cuda);
  const at::Tensor conv_reference = at::conv2d(images.to(at::kDouble), weight.to(at::kDouble));
  auto errors = [&](const Tf32Options& options) {
    apply_tf32(options);
    const double mm = relative_error(at::mm(a, b), mm_reference);
    const double conv = relative_error(at::conv2d(images, weight), conv_reference);
    return std::pair{mm, conv};
  };
  const auto [mm_off, conv_off] = errors({/*matmul=*/false, /*cudnn=*/false});
  const auto [mm_on, conv_still_off] = errors({/*matmul=*/true, /*cudnn=*/false});
  const auto [mm_off_again, conv_on] = errors({/*matmul=*/false, /*cudnn=*/true});
  apply_tf32({}); // PyTorch's defaults again for the tests after this one
  for (double error : {mm_off, conv_off, conv_still_off, mm_off_again}) {
    EXPECT_LT(error, 1e-5) << "float32 work with its TF32 switch off";
  }
  for (double error : {mm_on, conv_on}) {
    EXPECT_GT(error, 3e-5) << "TF32 switched on, but the result is float32-accurate";
    EXPECT_LT(error, 3e-3) << "TF32 switched on: more error than 10-bit inputs explain";
  }
  std::cout << "relative errors: matmul fp32 " << mm_off << ", tf32 " << mm_on
            << "; convolution fp32 " << conv_off << ", tf32 " << conv_on << "\n";
}

} // namespace
} // namespace largo::precision::mixed_precision_test
