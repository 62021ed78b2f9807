// The multi-crop model runs each resolution's views through the trunk together and the head
// once, view-major, as VISSL's multi-input forward: checked against the trunk and head run by
// hand on each view, for a classifier head and a swav_head (whose list is concatenated).
#include <largo/core/error.h>
#include <largo/models/flop_count.h>
#include <largo/models/model_factory.h>
#include <largo/models/multi_crop_model.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::models::multi_crop_model_test {
namespace {

ModelOptions small_resnet() {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 18;
  options.in_channels = 3;
  options.image_size = 32;
  options.num_classes = 5;
  return options;
}

std::vector<at::Tensor> views_of(int64_t n) {
  torch::manual_seed(3);
  return {torch::randn({n, 3, 32, 32}), torch::randn({n, 3, 32, 32}), torch::randn({n, 3, 16, 16})};
}

TEST(MultiCropModel, RunsEachResolutionThroughTheTrunkAndTheHeadOnceViewMajor) {
  torch::manual_seed(0);
  ModelOptions options = small_resnet();
  options.view_shapes = {{3, 32, 32}, {3, 32, 32}, {3, 16, 16}};
  RunModel run = build_run_model(options);
  ASSERT_TRUE(run.multi_crop);
  run.module()->eval(); // BatchNorm's running statistics: the same whatever the grouping
  EXPECT_EQ(
      run.multi_crop->resolution_groups(),
      (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 3}}));
  const auto views = views_of(4);
  const at::Tensor output = run.multi_crop->forward(pack_views(views));
  ASSERT_EQ(output.sizes(), at::IntArrayRef({12, 5}));
  for (size_t k = 0; k < views.size(); ++k) {
    const at::Tensor expected = run.model->forward(views[k]);
    EXPECT_TRUE(
        at::allclose(output.narrow(0, 4 * static_cast<int64_t>(k), 4), expected, 1e-5, 1e-6))
        << "view " << k;
  }
  // The same parameters, by the same names: a checkpoint's trunk is the model's.
  EXPECT_EQ(run.multi_crop->named_parameters().keys(), run.model->named_parameters().keys());
}

TEST(MultiCropModel, ConcatenatesTheSwavHeadsEmbeddingAndScores) {
  torch::manual_seed(0);
  ModelOptions options = small_resnet();
  options.swav_head.dims = {512, 32, 8};
  options.swav_head.num_clusters = {6, 4};
  options.view_shapes = {{3, 32, 32}, {3, 16, 16}};
  RunModel run = build_run_model(options);
  run.module()->eval();
  const auto views = views_of(2);
  const at::Tensor output = run.multi_crop->forward(pack_views({views[0], views[2]}));
  ASSERT_EQ(output.sizes(), at::IntArrayRef({4, 8 + 6 + 4}));
  auto* head = run.model->head()->ptr(0)->as<SwavHeadImpl>();
  ASSERT_NE(head, nullptr);
  const auto expected = head->forward(run.model->forward_trunk(views[2]));
  EXPECT_TRUE(at::allclose(output.narrow(0, 2, 2), at::cat(expected, 1), 1e-5, 1e-6));
}

// The FLOPs of a sample are those of each view at its size (the trunk and head run per view).
TEST(MultiCropModel, TrainingFlopsAreTheSumOverTheViews) {
  ModelOptions at32 = small_resnet();
  ModelOptions at16 = small_resnet();
  at16.image_size = 16;
  ModelOptions views = small_resnet();
  views.view_shapes = {{3, 32, 32}, {3, 32, 32}, {3, 16, 16}};
  EXPECT_EQ(
      training_flops_per_sample(views),
      2 * training_flops_per_sample(at32) + training_flops_per_sample(at16));
  EXPECT_GT(training_flops_per_sample(at32), training_flops_per_sample(at16)); // size counts
}

TEST(MultiCropModel, RefusesAnInputOfAnotherPackingAndFewerThanTwoViews) {
  ModelOptions options = small_resnet();
  options.view_shapes = {{3, 32, 32}, {3, 16, 16}};
  RunModel run = build_run_model(options);
  EXPECT_THROW(run.multi_crop->forward(torch::zeros({2, 10})), Error);
  options.view_shapes = {{3, 32, 32}};
  EXPECT_THROW(build_run_model(options), ConfigError);
}

} // namespace
} // namespace largo::models::multi_crop_model_test
