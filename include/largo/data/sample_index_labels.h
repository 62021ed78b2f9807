// VISSL's LABEL_TYPE: sample_index: every sample's label is its index in the dataset (what
// VISSL's self-supervised configs set: their losses ignore the labels). A decorator over any
// dataset: the images (and views) are the inner dataset's, only the labels change, so the
// loader, its per-sample draws and its workers behave exactly as without it.
// num_classes() stays the inner dataset's (the labels are not classes: only a run whose loss
// ignores the labels may use them, which the trainer checks).
#pragma once

#include <largo/data/dataset.h>

#include <memory>

namespace largo::data {

class SampleIndexLabels : public Dataset {
 public:
  explicit SampleIndexLabels(std::shared_ptr<const Dataset> inner);

  int64_t size() const override;
  std::vector<int64_t> sample_shape() const override;
  int64_t num_classes() const override;
  std::vector<std::vector<int64_t>> view_shapes() const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  Batch load_batch(const BatchRequest& request) const override;
  at::Tensor images() const override;
  at::Tensor labels() const override; // [size] int64: 0, 1, ..., size - 1

 private:
  std::shared_ptr<const Dataset> inner_;
};

} // namespace largo::data
