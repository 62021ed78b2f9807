// TrunkHeadModel: running block ranges equals running the whole trunk (what activation
// checkpointing and pipeline stages rely on), for every model in the zoo; block access;
// parameter naming; count_parameters.
#include <largo/models/model_factory.h>
#include <largo/models/module_swap.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace largo::models::trunk_head_model_test {
namespace {

struct ZooCase {
  const char* label;
  ModelOptions options;
};

std::vector<ZooCase> zoo() {
  std::vector<ZooCase> cases;
  auto base = [](const char* trunk, int64_t channels, int64_t size) {
    ModelOptions options;
    options.trunk_name = trunk;
    options.in_channels = channels;
    options.image_size = size;
    options.num_classes = 10;
    return options;
  };
  cases.push_back({"mlp", base("mlp", 1, 28)});
  cases.push_back({"small_cnn", base("small_cnn", 1, 28)});
  ModelOptions resnet18 = base("resnet", 3, 32);
  resnet18.resnet.depth = 18;
  resnet18.resnet.stem = "cifar";
  cases.push_back({"resnet18_cifar", resnet18});
  ModelOptions resnet50 = base("resnet", 3, 32); // 32 / 32 = 1x1 maps in the last stage
  resnet50.resnet.depth = 50;
  cases.push_back({"resnet50_imagenet", resnet50});
  ModelOptions vit = base("vision_transformer", 3, 32);
  vit.vit.patch_size = 8;
  vit.vit.num_layers = 2;
  vit.vit.num_heads = 2;
  vit.vit.hidden_dim = 32;
  vit.vit.mlp_dim = 64;
  cases.push_back({"vit", vit});
  return cases;
}

class TrunkRanges : public ::testing::TestWithParam<ZooCase> {};

TEST_P(TrunkRanges, SplitAtEveryBlockEqualsTheWholeTrunk) {
  const ModelOptions& options = GetParam().options;
  torch::manual_seed(0);
  TrunkHeadModel model = build_model(options);
  model->eval(); // BN running stats must not move between the runs
  at::Tensor images =
      torch::randn({2, options.in_channels, options.image_size, options.image_size});
  torch::NoGradGuard no_grad;
  at::Tensor full = model->forward_trunk(images);
  EXPECT_EQ(full.sizes().vec(), (std::vector<int64_t>{2, model->trunk_output_dim()}));
  const int64_t n = model->num_trunk_blocks();
  // Every split point; for deep trunks the ends and the middle keep the test fast.
  std::vector<int64_t> splits;
  for (int64_t k = 0; k <= n; ++k) {
    if (n <= 12 || k <= 2 || k >= n - 2 || k == n / 2) {
      splits.push_back(k);
    }
  }
  for (int64_t k : splits) {
    at::Tensor split = model->forward_trunk_range(model->forward_trunk_range(images, 0, k), k, n);
    EXPECT_TRUE(torch::equal(split, full)) << "split at block " << k;
  }
  EXPECT_TRUE(torch::equal(model->forward(images), model->forward_head(full)));
}

TEST_P(TrunkRanges, GradientsFlowThroughRanges) {
  const ModelOptions& options = GetParam().options;
  TrunkHeadModel model = build_model(options);
  at::Tensor images =
      torch::randn({2, options.in_channels, options.image_size, options.image_size});
  const int64_t middle = model->num_trunk_blocks() / 2;
  at::Tensor features = model->forward_trunk_range(images, 0, middle);
  model->forward_head(model->forward_trunk_range(features, middle, model->num_trunk_blocks()))
      .sum()
      .backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
  }
}

TEST_P(TrunkRanges, ParametersAreNamedTrunkOrHead) {
  TrunkHeadModel model = build_model(GetParam().options);
  int64_t head_parameters = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    EXPECT_TRUE(name.starts_with("trunk.") || name.starts_with("head.")) << name;
    head_parameters += name.starts_with("head.") ? item.value().numel() : 0;
  }
  EXPECT_EQ(head_parameters, model->trunk_output_dim() * 10 + 10);
  int64_t block_parameters = 0;
  for (int64_t i = 0; i < model->num_trunk_blocks(); ++i) {
    block_parameters += count_parameters(*model->trunk_block(i));
  }
  EXPECT_EQ(block_parameters + head_parameters, count_parameters(*model));
}

INSTANTIATE_TEST_SUITE_P(
    Zoo,
    TrunkRanges,
    ::testing::ValuesIn(zoo()),
    [](const ::testing::TestParamInfo<ZooCase>& info) { return std::string(info.param.label); });

TEST(TrunkHeadModel, BadRangesAndBlockIndicesThrow) {
  ModelOptions options;
  options.trunk_name = "mlp";
  options.in_channels = 1;
  options.image_size = 4;
  TrunkHeadModel model = build_model(options);
  at::Tensor x = torch::randn({1, 1, 4, 4});
  EXPECT_THROW(model->forward_trunk_range(x, 1, 0), largo::Error);
  EXPECT_THROW(model->forward_trunk_range(x, -1, 1), largo::Error);
  EXPECT_THROW(model->forward_trunk_range(x, 0, 3), largo::Error);
  EXPECT_TRUE(torch::equal(model->forward_trunk_range(x, 1, 1), x)); // empty range
  EXPECT_THROW(model->trunk_block(2), largo::Error);
  EXPECT_THROW(model->trunk_block(-1), largo::Error);
  EXPECT_NE(model->trunk_block(1)->as<MlpBlockImpl>(), nullptr);
}

// swap_child (module_swap.h's swap_sequential_member): a Sequential takes the head's place
// and is the one forward runs; another child name, or a module that is not a Sequential, is
// an error naming what the model can swap.
TEST(TrunkHeadModel, SwapsItsHeadForASequentialOnly) {
  ModelOptions options;
  options.trunk_name = "mlp";
  options.in_channels = 1;
  options.image_size = 4;
  TrunkHeadModel model = build_model(options);
  at::Tensor x = torch::randn({2, 1, 4, 4});
  torch::nn::Sequential doubled(torch::nn::Functional([](at::Tensor t) { return t * 2; }));
  model->swap_child("head", SwappedModule{{}, doubled});
  EXPECT_TRUE(torch::equal(model->forward(x), model->forward_trunk(x) * 2));
  auto message = [&](const std::string& name, const SwappedModule& replacement) {
    try {
      model->swap_child(name, replacement);
    } catch (const largo::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string wrong_name = message("neck", SwappedModule{{}, doubled});
  EXPECT_NE(
      wrong_name.find("can only swap its trunk or head for a Sequential, not neck"),
      std::string::npos)
      << wrong_name;
  const std::string not_sequential =
      message("head", SwappedModule{torch::nn::AnyModule(torch::nn::Identity()), nullptr});
  EXPECT_NE(not_sequential.find("not head for a torch::nn::Identity"), std::string::npos)
      << not_sequential;
}

TEST(CountParameters, CountsSharedParametersOnce) {
  torch::nn::Linear shared(4, 3);
  torch::nn::Sequential twice(shared, shared);
  EXPECT_EQ(count_parameters(*twice), 4 * 3 + 3);
  torch::nn::BatchNorm2d bn(8); // running stats are buffers, not parameters
  EXPECT_EQ(count_parameters(*bn), 16);
}

} // namespace
} // namespace largo::models::trunk_head_model_test
