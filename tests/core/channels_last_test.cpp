// to_channels_last gives NHWC strides exactly, including where ATen's contiguous(ChannelsLast)
// keeps NCHW's (a dimension of size 1 makes both layouts "contiguous"), and keeps the values.
#include <largo/core/channels_last.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::channels_last_test {
namespace {

std::vector<int64_t> nhwc_strides(at::IntArrayRef sizes) {
  return c10::get_channels_last_strides_2d(sizes);
}

TEST(ChannelsLast, GivesNhwcStridesWhereContiguousChannelsLastKeepsNchw) {
  // A 1x1 kernel: NCHW strides pass ATen's channels-last contiguity check, so
  // contiguous(ChannelsLast) returns the tensor as it is (the precondition of this test).
  const at::Tensor kernel = torch::randn({8, 4, 1, 1});
  ASSERT_TRUE(kernel.is_contiguous(at::MemoryFormat::ChannelsLast));
  ASSERT_EQ(kernel.contiguous(at::MemoryFormat::ChannelsLast).strides(), kernel.strides());
  EXPECT_FALSE(has_channels_last_strides(kernel));

  const at::Tensor converted = to_channels_last(kernel);
  EXPECT_EQ(converted.strides().vec(), nhwc_strides(kernel.sizes()));
  EXPECT_TRUE(has_channels_last_strides(converted));
  EXPECT_TRUE(torch::equal(converted, kernel));
}

TEST(ChannelsLast, ConvertsABatchAndReturnsOneAlreadyLaidOutAsItIs) {
  const at::Tensor batch = torch::arange(2 * 3 * 4 * 5, at::kFloat).view({2, 3, 4, 5});
  const at::Tensor converted = to_channels_last(batch);
  EXPECT_EQ(converted.strides().vec(), (std::vector<int64_t>{60, 1, 15, 3}));
  EXPECT_TRUE(torch::equal(converted, batch));
  EXPECT_EQ(to_channels_last(converted).data_ptr(), converted.data_ptr());
}

TEST(ChannelsLast, RefusesATensorThatIsNotFourDimensional) {
  EXPECT_FALSE(has_channels_last_strides(torch::zeros({3, 4})));
  EXPECT_THROW(to_channels_last(torch::zeros({3, 4, 5})), c10::Error);
}

} // namespace
} // namespace largo::channels_last_test
