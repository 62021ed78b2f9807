#include <largo/train/accuracy_meter.h>

#include <largo/core/error.h>

#include <fmt/format.h>

namespace largo::train {

AccuracyMeter::AccuracyMeter(std::vector<int64_t> topk_values)
    : topk_values_(std::move(topk_values)), num_correct_(topk_values_.size(), 0) {
  for (int64_t k : topk_values_) {
    if (k < 1) {
      throw ConfigError(fmt::format(
          "config key METERS.accuracy_list_meter.topk_values contains {}: expected k >= 1", k));
    }
  }
}

void AccuracyMeter::update(const at::Tensor& logits, const at::Tensor& labels) {
  int64_t max_k = *std::max_element(topk_values_.begin(), topk_values_.end());
  max_k = std::min(max_k, logits.size(1));
  // [batch, max_k] indices of the highest logits, best first.
  at::Tensor top = std::get<1>(logits.topk(max_k, /*dim=*/1));
  at::Tensor hits = top.eq(labels.view({-1, 1})); // [batch, max_k]
  at::Tensor cumulative = hits.cumsum(1); // hit within the first j+1 columns
  for (size_t i = 0; i < topk_values_.size(); ++i) {
    int64_t k = std::min(topk_values_[i], max_k);
    num_correct_[i] += cumulative.select(1, k - 1).gt(0).sum().item<int64_t>();
  }
  num_samples_ += labels.size(0);
}

void AccuracyMeter::reset() {
  std::fill(num_correct_.begin(), num_correct_.end(), 0);
  num_samples_ = 0;
}

void AccuracyMeter::reduce_over(comm::ProcessGroup& group) {
  std::vector<int64_t> counts(num_correct_);
  counts.push_back(num_samples_);
  at::Tensor totals = at::tensor(counts, at::kLong);
  group.all_reduce(totals);
  for (size_t i = 0; i < num_correct_.size(); ++i) {
    num_correct_[i] = totals[static_cast<int64_t>(i)].item<int64_t>();
  }
  num_samples_ = totals[static_cast<int64_t>(num_correct_.size())].item<int64_t>();
}

std::vector<double> AccuracyMeter::values() const {
  std::vector<double> out;
  for (int64_t correct : num_correct_) {
    out.push_back(num_samples_ == 0 ? 0.0 : 100.0 * static_cast<double>(correct) / num_samples_);
  }
  return out;
}

} // namespace largo::train
