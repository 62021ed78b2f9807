// Top-k accuracy over an evaluation pass (VISSL's accuracy_list_meter), in percent.
#pragma once

#include <largo/comm/process_group.h>

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace largo::train {

class AccuracyMeter {
 public:
  explicit AccuracyMeter(std::vector<int64_t> topk_values);

  // logits: [batch, num_classes]; labels: [batch] int64.
  void update(const at::Tensor& logits, const at::Tensor& labels);
  void reset();
  // Sums the counts of every rank into every rank's meter (a collective), after each rank
  // evaluated its own share of the data.
  void reduce_over(comm::ProcessGroup& group);

  // Percent of samples whose label is among the k highest logits, for each k given.
  std::vector<double> values() const;
  const std::vector<int64_t>& topk_values() const {
    return topk_values_;
  }
  int64_t num_samples() const {
    return num_samples_;
  }

 private:
  std::vector<int64_t> topk_values_;
  std::vector<int64_t> num_correct_;
  int64_t num_samples_ = 0;
};

} // namespace largo::train
