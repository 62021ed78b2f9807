// data::SampleIndexLabels: the inner dataset's images with each sample's index as label.
#include <largo/data/sample_index_labels.h>
#include <largo/data/synthetic_dataset.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace largo::data::sample_index_labels_test {
namespace {

TEST(SampleIndexLabels, LabelsAreTheIndicesAndTheImagesTheInnerDatasets) {
  auto inner = std::make_shared<SyntheticDataset>(12, std::vector<int64_t>{3, 4, 4}, 5, 7);
  const SampleIndexLabels dataset(inner);
  EXPECT_EQ(dataset.size(), 12);
  EXPECT_EQ(dataset.sample_shape(), inner->sample_shape());
  EXPECT_EQ(dataset.num_classes(), 5);
  const std::vector<int64_t> indices{9, 2, 2, 11};
  const Batch batch = dataset.get_batch(indices);
  EXPECT_TRUE(torch::equal(batch.labels, torch::tensor(indices, torch::kLong)));
  EXPECT_TRUE(torch::equal(batch.images, inner->get_batch(indices).images));
  BatchRequest request;
  request.indices = {4, 0};
  const Batch loaded = dataset.load_batch(request);
  EXPECT_TRUE(torch::equal(loaded.labels, torch::tensor(request.indices, torch::kLong)));
  EXPECT_TRUE(torch::equal(loaded.images, inner->load_batch(request).images));
  EXPECT_TRUE(torch::equal(dataset.labels(), torch::arange(12, torch::kLong)));
  EXPECT_TRUE(torch::equal(dataset.images(), inner->images()));
}

} // namespace
} // namespace largo::data::sample_index_labels_test
