// VISSL's multicrop_collator / simclr_collator orders on a loader's views.
#include "largo/data/multi_view_collate.h"

#include <gtest/gtest.h>

namespace largo::data::multi_view_collate_test {
namespace {

// View k of sample n holds the value 10 * k + n everywhere.
std::vector<at::Tensor> numbered_views(int64_t num_views, int64_t batch) {
  std::vector<at::Tensor> views;
  for (int64_t k = 0; k < num_views; ++k) {
    views.push_back((at::arange(batch, at::kFloat) + 10.0 * static_cast<double>(k))
                        .view({batch, 1, 1, 1})
                        .expand({batch, 3, 4, 4}));
  }
  return views;
}

TEST(MultiViewCollate, SimclrStacksViewMajorAsVissl) {
  // simclr_collator: output = [img1_0, img2_0, ..., img1_1, img2_1, ...].
  const at::Tensor stacked = simclr_collate(numbered_views(2, 3));
  ASSERT_EQ(stacked.sizes().vec(), (std::vector<int64_t>{6, 3, 4, 4}));
  const std::vector<float> expected{0, 1, 2, 10, 11, 12};
  for (int64_t row = 0; row < 6; ++row) {
    EXPECT_EQ(stacked[row][2][3][1].item<float>(), expected[static_cast<size_t>(row)]) << row;
  }
}

TEST(MultiViewCollate, LabelsRepeatViewMajor) {
  const at::Tensor labels = at::tensor(std::vector<int64_t>{4, 7, 1}, at::kLong);
  const at::Tensor repeated = labels_per_view(labels, 3);
  const std::vector<int64_t> expected{4, 7, 1, 4, 7, 1, 4, 7, 1};
  EXPECT_TRUE(repeated.equal(at::tensor(expected, at::kLong)));
  EXPECT_THROW(labels_per_view(labels, 0), c10::Error);
}

TEST(MultiViewCollate, SimclrRefusesViewsOfDifferentSizes) {
  std::vector<at::Tensor> views = numbered_views(2, 3);
  views.push_back(at::zeros({3, 3, 2, 2}));
  EXPECT_THROW(simclr_collate(views), c10::Error);
  EXPECT_THROW(simclr_collate({}), c10::Error);
}

} // namespace
} // namespace largo::data::multi_view_collate_test
