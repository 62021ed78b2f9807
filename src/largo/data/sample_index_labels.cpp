#include <largo/data/sample_index_labels.h>

#include <torch/torch.h>

#include <utility>

namespace largo::data {
namespace {

Batch with_index_labels(Batch batch, const std::vector<int64_t>& indices) {
  batch.labels = torch::tensor(indices, torch::kLong);
  return batch;
}

} // namespace

SampleIndexLabels::SampleIndexLabels(std::shared_ptr<const Dataset> inner)
    : inner_(std::move(inner)) {}

int64_t SampleIndexLabels::size() const {
  return inner_->size();
}

std::vector<int64_t> SampleIndexLabels::sample_shape() const {
  return inner_->sample_shape();
}

int64_t SampleIndexLabels::num_classes() const {
  return inner_->num_classes();
}

std::vector<std::vector<int64_t>> SampleIndexLabels::view_shapes() const {
  return inner_->view_shapes();
}

Batch SampleIndexLabels::get_batch(const std::vector<int64_t>& indices) const {
  return with_index_labels(inner_->get_batch(indices), indices);
}

Batch SampleIndexLabels::load_batch(const BatchRequest& request) const {
  return with_index_labels(inner_->load_batch(request), request.indices);
}

at::Tensor SampleIndexLabels::images() const {
  return inner_->images();
}

at::Tensor SampleIndexLabels::labels() const {
  return torch::arange(size(), torch::kLong);
}

} // namespace largo::data
