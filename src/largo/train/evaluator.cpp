#include <largo/train/evaluator.h>

#include <largo/models/linear_eval.h>
#include <largo/train/accuracy_meter.h>

#include <algorithm>

namespace largo::train {

std::optional<double> EvaluationResult::top(int64_t k) const {
  for (size_t i = 0; i < topk.size(); ++i) {
    if (topk[i] == k) {
      return topk_percent[i];
    }
  }
  return std::nullopt;
}

namespace {

// The result of one meter per output (one per head).
EvaluationResult result_of(std::vector<AccuracyMeter>& meters, comm::ProcessGroup& group) {
  EvaluationResult result;
  for (AccuracyMeter& meter : meters) {
    meter.reduce_over(group);
    result.output_topk_percent.push_back(meter.values());
  }
  result.num_samples = meters.front().num_samples();
  result.topk = meters.front().topk_values();
  for (size_t i = 1; i < meters.size(); ++i) {
    if (!result.topk.empty() &&
        result.output_topk_percent[i][0] >
            result.output_topk_percent[static_cast<size_t>(result.best_output)][0]) {
      result.best_output = static_cast<int64_t>(i);
    }
  }
  result.topk_percent = result.output_topk_percent[static_cast<size_t>(result.best_output)];
  if (meters.size() == 1) {
    result.output_topk_percent.clear();
  }
  return result;
}

} // namespace

EvaluationResult evaluate(
    parallel::ParallelModel& model,
    TrainingData& data,
    torch::Device device,
    const EvaluationOptions& options) {
  model.module()->eval();
  torch::NoGradGuard no_grad;
  std::vector<AccuracyMeter> meters(
      std::max<size_t>(options.output_widths.size(), 1), AccuracyMeter(options.topk_values));
  ClassificationLossOptions summed = options.loss;
  summed.sum = true; // the batches' and ranks' sums, divided once by the sample count
  double loss_sum = 0.0;
  data::DataLoader& loader = data.test_loader();
  loader.start_epoch(data.test_order(), /*epoch=*/0, /*start_batch=*/0);
  const int64_t num_batches = loader.num_batches();
  while (auto batch = loader.next()) {
    at::Tensor images = batch->images.to(device);
    at::Tensor labels = batch->labels.to(device);
    const std::vector<at::Tensor> outputs =
        models::split_outputs(model.forward(images), options.output_widths);
    loss_sum += classification_loss(outputs, labels, summed).item<double>();
    for (size_t i = 0; i < outputs.size(); ++i) {
      meters[i].update(outputs[i], labels);
    }
  }
  // Where an evaluation forward communicates, ranks with fewer test batches run more.
  model.match_evaluation_forwards(num_batches, options.sample_shape, device);
  at::Tensor total_loss = at::tensor({loss_sum}, at::kDouble);
  // A pipeline's stages all saw their replica's outputs: the replicas' sums are the test set's.
  model.data_parallel_group().all_reduce(total_loss);
  EvaluationResult result = result_of(meters, model.data_parallel_group());
  result.loss = result.num_samples > 0 ? total_loss.item<double>() / result.num_samples : 0.0;
  model.module()->train();
  return result;
}

} // namespace largo::train
