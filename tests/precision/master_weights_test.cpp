// Apex O2's pieces: the model cast (BatchNorm kept in float32) and float32 master weights
// that the optimizer updates and that are copied down into the model after each step.
#include <largo/core/error.h>
#include <largo/precision/master_weights.h>
#include <largo/precision/model_cast.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::precision::master_weights_test {
namespace {

torch::nn::Sequential small_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1).bias(false)),
      torch::nn::BatchNorm2d(4), torch::nn::ReLU(), torch::nn::Flatten(),
      torch::nn::Linear(4 * 6 * 6, 3));
}

TEST(ModelCast, CastsEverythingButBatchNorm) {
  auto model = small_model();
  cast_model(*model, {at::kBFloat16, /*keep_batchnorm_fp32=*/true, {}});
  for (const auto& item : model->named_parameters()) {
    const bool in_batchnorm = item.key().rfind("1.", 0) == 0;
    EXPECT_EQ(item.value().scalar_type(), in_batchnorm ? at::kFloat : at::kBFloat16) << item.key();
  }
  for (const auto& item : model->named_buffers()) {
    if (item.key() == "1.num_batches_tracked") {
      EXPECT_EQ(item.value().scalar_type(), at::kLong);
    } else {
      EXPECT_EQ(item.value().scalar_type(), at::kFloat) << item.key();
    }
  }
}

TEST(ModelCast, WithoutKeepBatchnormEverythingIsCast) {
  auto model = small_model();
  cast_model(*model, {at::kBFloat16, /*keep_batchnorm_fp32=*/false, {}});
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), at::kBFloat16) << item.key();
  }
  EXPECT_EQ(model->named_buffers()["1.running_var"].scalar_type(), at::kBFloat16);
  EXPECT_EQ(model->named_buffers()["1.num_batches_tracked"].scalar_type(), at::kLong);
  // The model still runs (bfloat16 BatchNorm on the CPU).
  at::Tensor out = model->forward(at::randn({2, 1, 6, 6}).to(at::kBFloat16));
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
}

TEST(ModelCast, ParametersKeepTheirIdentity) {
  auto model = small_model();
  at::Tensor weight_before = model->named_parameters()["0.weight"];
  cast_model(*model, {at::kBFloat16, true, {}});
  at::Tensor weight_after = model->named_parameters()["0.weight"];
  EXPECT_TRUE(weight_before.is_same(weight_after));
  EXPECT_EQ(weight_before.scalar_type(), at::kBFloat16);
}

TEST(MasterWeights, Float32CopiesForLowPrecisionParametersOnly) {
  auto model = small_model();
  cast_model(*model, {at::kBFloat16, true, {}});
  MasterWeights masters(*model);
  auto params = model->named_parameters();
  ASSERT_EQ(masters.names().size(), params.size());
  for (const auto& item : params) {
    const at::Tensor& master = masters.master(item.key());
    EXPECT_EQ(master.scalar_type(), at::kFloat) << item.key();
    if (item.value().scalar_type() == at::kFloat) {
      EXPECT_TRUE(master.is_same(item.value())) << item.key() << " is its own master";
    } else {
      EXPECT_FALSE(master.is_same(item.value()));
      EXPECT_TRUE(torch::equal(master, item.value().to(at::kFloat))) << item.key();
    }
  }
  EXPECT_EQ(masters.copy_bytes(), (4 * 9 + 3 * 144 + 3) * 4);
  EXPECT_THROW(masters.master("9.weight"), Error);
}

TEST(MasterWeights, OptimizerUpdatesMastersAndModelIsMastersCastDown) {
  auto model = small_model();
  cast_model(*model, {at::kBFloat16, true, {}});
  MasterWeights masters(*model);
  torch::optim::SGD optimizer(masters.masters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  at::Tensor images = at::randn({8, 1, 6, 6});
  at::Tensor labels = at::randint(0, 3, {8});
  auto params = model->named_parameters();
  for (int step = 0; step < 4; ++step) {
    optimizer.zero_grad();
    at::Tensor logits = model->forward(images.to(at::kBFloat16)).to(at::kFloat);
    torch::nn::functional::cross_entropy(logits, labels).backward();
    masters.copy_grads_to_masters();
    for (size_t i = 0; i < masters.names().size(); ++i) {
      const at::Tensor& master = masters.masters()[i];
      ASSERT_TRUE(master.grad().defined()) << masters.names()[i];
      EXPECT_EQ(master.grad().scalar_type(), at::kFloat);
      if (!master.is_same(params[masters.names()[i]])) {
        EXPECT_FALSE(params[masters.names()[i]].grad().defined()) << "model grad freed";
      }
    }
    optimizer.step();
    masters.copy_masters_to_model();
    for (const auto& item : params) {
      const at::Tensor& master = masters.master(item.key());
      EXPECT_EQ(master.scalar_type(), at::kFloat);
      // Bitwise: the model's weight is exactly the master rounded to the model's dtype.
      EXPECT_TRUE(torch::equal(item.value(), master.to(item.value().scalar_type())))
          << item.key() << " step " << step;
    }
    for (const auto& name : {"1.weight", "1.bias"}) {
      EXPECT_EQ(params[name].scalar_type(), at::kFloat) << "BatchNorm stays float32";
    }
  }
}

TEST(MasterWeights, SmallUpdatesAccumulateInTheMasters) {
  // bfloat16 has 8 bits of mantissa: adding 1e-4 to 1.0 is lost in the weight itself but
  // not in its float32 master, whose updates reach the weight once they add up.
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(false));
  {
    torch::NoGradGuard no_grad;
    linear->weight.fill_(1.0);
  }
  cast_model(*linear, {at::kBFloat16, true, {}});
  MasterWeights masters(*linear);
  at::Tensor master = masters.master("weight");
  for (int step = 0; step < 100; ++step) {
    torch::NoGradGuard no_grad;
    master.add_(1e-4);
    masters.copy_masters_to_model();
  }
  EXPECT_NEAR(master.item<float>(), 1.01f, 1e-5);
  EXPECT_EQ(linear->weight.item<float>(), 1.0078125f); // 1.01 rounded to bfloat16
}

TEST(MasterWeights, StateRoundTripIsBitExactAndChecksNames) {
  auto model = small_model();
  cast_model(*model, {at::kBFloat16, true, {}});
  MasterWeights masters(*model);
  {
    torch::NoGradGuard no_grad;
    for (const auto& master : masters.masters()) {
      master.add_(1e-3); // masters that differ from the weights cast up
    }
  }
  auto state = masters.state_dict();
  EXPECT_EQ(state.size(), 3u); // conv weight, linear weight and bias (BatchNorm: own master)
  auto other = small_model();
  cast_model(*other, {at::kBFloat16, true, {}});
  MasterWeights restored(*other);
  restored.load_state_dict(state);
  for (size_t i = 0; i < masters.names().size(); ++i) {
    if (state.contains(masters.names()[i])) {
      EXPECT_TRUE(torch::equal(restored.masters()[i], masters.masters()[i])) << masters.names()[i];
    }
  }
  for (const auto& item : other->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), restored.master(item.key()).to(item.value().scalar_type())));
  }
  auto wrong = masters.state_dict().copy();
  ASSERT_EQ(wrong.erase("0.weight"), 1u);
  wrong.insert("0.weigth", at::zeros({4, 1, 3, 3}));
  try {
    restored.load_state_dict(wrong);
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("missing: [0.weight]"), std::string::npos) << message;
    EXPECT_NE(message.find("unexpected: [0.weigth]"), std::string::npos) << message;
  }
}

} // namespace
} // namespace largo::precision::master_weights_test
