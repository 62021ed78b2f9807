// VISSL's padded multi-crop forward (padded_crops.h), against VISSL's steps written with ATen's
// ops: the crops padded at the bottom right with zeros, the trunk run to its last stage on the
// whole padded batch, the padding mask interpolated to the feature map with
// upsample_nearest2d (VISSL's F.interpolate), each crop's map cut to the unmasked rows and
// columns of its first image and average-pooled, then the head. Training mode, so BatchNorm
// normalises over the padded batch as in VISSL.
#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/models/multi_crop_model.h>
#include <largo/models/padded_crops.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::models::padded_crops_test {
namespace {

// VISSL's interpolated mask: how many of `out` rows of the nearest-interpolated padding mask
// are unpadded, for `valid` of `padded` rows (the rows of its first column).
int64_t interpolated_valid_rows(int64_t valid, int64_t padded, int64_t out) {
  at::Tensor mask = torch::ones({1, 1, padded, 3}, torch::kBool);
  mask.narrow(2, 0, valid).fill_(false);
  const at::Tensor interpolated =
      at::upsample_nearest2d(mask.to(torch::kFloat), {out, 3}).to(torch::kBool);
  return (~interpolated)[0][0].select(1, 0).sum().item<int64_t>();
}

TEST(PaddedCrops, TheValidExtentIsTheNearestInterpolatedMasks) {
  // SEER's 160 and 96 px crops at RegNet's stride 32, DINO's 224 and 96 at 16 and 32, small
  // odd sizes, and feature maps larger than the input (nearest's 2x and general paths).
  const std::vector<std::array<int64_t, 3>> cases = {
      {96, 160, 5},
      {160, 160, 5},
      {96, 224, 14},
      {96, 224, 7},
      {17, 33, 5},
      {16, 32, 1},
      {16, 32, 2},
      {20, 32, 3},
      {5, 7, 14},
      {5, 7, 21},
      {1, 9, 4},
      {29, 31, 30}};
  for (const auto& [valid, padded, out] : cases) {
    EXPECT_EQ(nearest_valid_extent(valid, padded, out), interpolated_valid_rows(valid, padded, out))
        << valid << " of " << padded << " rows onto " << out;
  }
}

TEST(PaddedCrops, ViewsArePaddedToTheLargestAtTheTopLeftViewMajor) {
  torch::manual_seed(0);
  const at::Tensor large = torch::randn({2, 3, 6, 5});
  const at::Tensor small = torch::randn({2, 3, 4, 3});
  const at::Tensor padded = pad_views_to_largest({large, small});
  ASSERT_EQ(padded.sizes(), at::IntArrayRef({4, 3, 6, 5}));
  EXPECT_TRUE(torch::equal(padded.narrow(0, 0, 2), large));
  const at::Tensor second = padded.narrow(0, 2, 2);
  EXPECT_TRUE(torch::equal(second.narrow(2, 0, 4).narrow(3, 0, 3), small));
  at::Tensor beside = second.clone();
  beside.narrow(2, 0, 4).narrow(3, 0, 3).zero_();
  EXPECT_TRUE(torch::equal(beside, torch::zeros_like(beside))) << "zeros beside the small view";
}

ModelOptions small_regnet(const std::vector<std::vector<int64_t>>& views) {
  ModelOptions options;
  options.trunk_name = "regnet";
  options.regnet = regnet_preset("regnet_y_400mf");
  options.in_channels = 3;
  options.image_size = 32;
  options.num_classes = 5;
  options.view_shapes = views;
  options.pad_views = true;
  return options;
}

// VISSL's steps by hand on the trunk's own blocks: the training-mode forward of 2 large and 2
// small crops of 20 px equals the model's. regnet_y_400mf maps 32 px to a 1 x 1 map and 64 px
// to 2 x 2, where nearest sampling reaches the small crops' pixels in the first row and column.
TEST(PaddedCrops, TheModelPoolsEachCropOverItsUnpaddedPartAsVisslDoes) {
  for (const int64_t large : {32, 64}) {
    SCOPED_TRACE(large);
    torch::manual_seed(0);
    const std::vector<std::vector<int64_t>> shapes = {
        {3, large, large}, {3, large, large}, {3, 20, 20}, {3, 20, 20}};
    RunModel run = build_run_model(small_regnet(shapes));
    ASSERT_TRUE(run.multi_crop && run.multi_crop->pads_views());
    std::vector<at::Tensor> views;
    for (const auto& shape : shapes) {
      views.push_back(torch::randn({3, shape[0], shape[1], shape[2]}));
    }
    const at::Tensor output = run.multi_crop->forward(pack_views(views));

    at::Tensor x = at::zeros({12, 3, large, large});
    at::Tensor mask = torch::ones({12, large, large}, torch::kBool);
    for (int64_t k = 0; k < 4; ++k) {
      x.narrow(0, 3 * k, 3).narrow(2, 0, shapes[k][1]).narrow(3, 0, shapes[k][2]).copy_(views[k]);
      mask.narrow(0, 3 * k, 3).narrow(1, 0, shapes[k][1]).narrow(2, 0, shapes[k][2]).fill_(false);
    }
    torch::nn::Sequential trunk = run.multi_crop->trunk(); // a holder: the same module
    auto block = trunk->begin();
    for (size_t i = 0; i + 1 < trunk->size(); ++i, ++block) { // every element but the pool
      x = block->forward<at::Tensor>(x);
    }
    const at::Tensor valid =
        ~at::upsample_nearest2d(mask.unsqueeze(0).to(torch::kFloat), {x.size(2), x.size(3)})
             .to(torch::kBool)[0];
    std::vector<at::Tensor> pooled;
    for (int64_t k = 0; k < 4; ++k) {
      const at::Tensor first = valid[3 * k];
      const int64_t rows = first.sum(0)[0].item<int64_t>();
      const int64_t cols = first.sum(1)[0].item<int64_t>();
      const at::Tensor part = x.narrow(0, 3 * k, 3).narrow(2, 0, rows).narrow(3, 0, cols);
      pooled.push_back(torch::adaptive_avg_pool2d(part, {1, 1}).flatten(1));
    }
    torch::nn::Sequential head = run.multi_crop->head();
    const at::Tensor expected = head->forward(at::cat(pooled, 0));
    ASSERT_EQ(output.sizes(), expected.sizes());
    EXPECT_TRUE(torch::equal(output, expected))
        << "differs by " << (output - expected).abs().max().item<double>();
  }
}

// Crops of one size pad nothing: the one pass is the separate forward's one pass, bit for bit
// (the same parameters, by the same names).
TEST(PaddedCrops, CropsOfOneSizeForwardAsWithoutPadding) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 32, 32}, {3, 32, 32}};
  torch::manual_seed(0);
  RunModel padded = build_run_model(small_regnet(shapes));
  ModelOptions plain_options = small_regnet(shapes);
  plain_options.pad_views = false;
  torch::manual_seed(0);
  RunModel plain = build_run_model(plain_options);
  EXPECT_EQ(
      padded.multi_crop->named_parameters().keys(), plain.multi_crop->named_parameters().keys());
  const at::Tensor packed =
      pack_views({torch::randn({3, 3, 32, 32}), torch::randn({3, 3, 32, 32})});
  EXPECT_TRUE(torch::equal(padded.multi_crop->forward(packed), plain.multi_crop->forward(packed)));
}

TEST(PaddedCrops, ATrunkWithoutAGlobalPoolIsRefused) {
  ModelOptions options = small_regnet({{3, 32, 32}, {3, 16, 16}});
  options.trunk_name = "vision_transformer";
  options.vit.patch_size = 8;
  options.vit.num_layers = 1;
  options.vit.num_heads = 2;
  options.vit.hidden_dim = 16;
  options.vit.mlp_dim = 32;
  EXPECT_THROW(build_run_model(options), ConfigError);
}

} // namespace
} // namespace largo::models::padded_crops_test
