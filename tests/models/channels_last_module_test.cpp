// convert_to_channels_last lays every 4-D parameter of a model out NHWC in place and leaves
// the others; a channels-last convolution agrees with the NCHW one within the rounding bound
// of its sums (oneDNN adds the products in another order).
#include <largo/models/channels_last_module.h>

#include <largo/core/channels_last.h>
#include <largo/models/model_factory.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

namespace largo::models::channels_last_module_test {
namespace {

ModelOptions small_resnet() {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 18;
  options.resnet.stem = "cifar";
  options.in_channels = 3;
  options.image_size = 16;
  options.num_classes = 10;
  return options;
}

TEST(ChannelsLastModule, ConvertsEveryConvolutionWeightInPlaceAndNothingElse) {
  TrunkHeadModel model = build_model(small_resnet());
  std::map<std::string, at::Tensor> before;
  std::map<std::string, at::TensorImpl*> objects;
  int64_t four_dimensional = 0;
  for (const auto& item : model->named_parameters()) {
    before[item.key()] = item.value().detach().clone();
    objects[item.key()] = item.value().unsafeGetTensorImpl();
    four_dimensional += item.value().dim() == 4 ? 1 : 0;
  }
  ASSERT_GT(four_dimensional, 0);
  EXPECT_TRUE(has_convolution_weights(*model));

  EXPECT_EQ(convert_to_channels_last(*model), four_dimensional);
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& value = item.value();
    EXPECT_EQ(value.unsafeGetTensorImpl(), objects[item.key()]) << item.key(); // in place
    EXPECT_TRUE(torch::equal(value, before[item.key()])) << item.key();
    if (value.dim() == 4) { // the 1x1 shortcut convolutions included
      EXPECT_TRUE(has_channels_last_strides(value)) << item.key();
    } else {
      EXPECT_TRUE(value.is_contiguous()) << item.key();
    }
  }
  EXPECT_EQ(convert_to_channels_last(*model), 0); // nothing left to convert
}

TEST(ChannelsLastModule, AModelWithoutConvolutionsHasNoWeightsToConvert) {
  ModelOptions options = small_resnet();
  options.trunk_name = "mlp";
  options.image_size = 4;
  TrunkHeadModel model = build_model(options);
  EXPECT_FALSE(has_convolution_weights(*model));
  EXPECT_EQ(convert_to_channels_last(*model), 0);
}

// Each output of a 3x3 convolution over 16 channels sums K = 144 products; computed in
// float32 in any order, it is within K * u * sum|x||w| of the exact sum (u = 2^-24, the
// unit roundoff; the classic bound for recursive summation), so two orders are within twice
// that of each other.
TEST(ChannelsLastModule, AChannelsLastConvolutionAgreesWithNchwWithinTheSummationBound) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(16, 32, 3).padding(1));
  const at::Tensor images = torch::randn({4, 16, 12, 12});
  torch::NoGradGuard no_grad;
  const at::Tensor nchw = conv->forward(images);
  const at::Tensor magnitude = at::conv2d(images.abs(), conv->weight.abs(), conv->bias.abs(), 1, 1);
  convert_to_channels_last(*conv);
  const at::Tensor nhwc = conv->forward(to_channels_last(images));
  EXPECT_TRUE(nhwc.is_contiguous(at::MemoryFormat::ChannelsLast)); // oneDNN ran NHWC
  const double unit_roundoff = std::numeric_limits<float>::epsilon() / 2;
  const int64_t products = 16 * 3 * 3 + 1; // and the bias
  const at::Tensor bound = magnitude * (2.0 * static_cast<double>(products) * unit_roundoff);
  EXPECT_TRUE((nchw - nhwc).abs().le(bound).all().item<bool>())
      << "largest excess " << ((nchw - nhwc).abs() - bound).max().item<double>();
}

} // namespace
} // namespace largo::models::channels_last_module_test
