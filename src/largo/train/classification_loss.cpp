#include <largo/train/classification_loss.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/normalization.h>

namespace largo::train {

at::Tensor classification_loss(
    const at::Tensor& output, const at::Tensor& targets, const ClassificationLossOptions& options) {
  return classification_loss(std::vector<at::Tensor>{output}, targets, options);
}

at::Tensor classification_loss(
    const std::vector<at::Tensor>& outputs,
    const at::Tensor& targets,
    const ClassificationLossOptions& options) {
  namespace F = torch::nn::functional;
  if (!(options.temperature > 0)) {
    throw config_error(
        "LOSS.cross_entropy_multiple_output_single_target.temperature",
        fmt::format("{}", options.temperature),
        "a number > 0");
  }
  if (outputs.empty()) {
    throw Error("classification_loss: the model returned no outputs");
  }
  at::Tensor total;
  for (const at::Tensor& output : outputs) {
    at::Tensor logits = output;
    if (options.normalize_output) {
      logits = F::normalize(logits, F::NormalizeFuncOptions().p(2).dim(1));
    }
    if (options.temperature != 1.0) {
      logits = logits / options.temperature;
    }
    auto cross_entropy = F::CrossEntropyFuncOptions().ignore_index(options.ignore_index);
    if (options.sum) {
      cross_entropy.reduction(torch::kSum);
    }
    if (!options.weight.empty()) {
      if (static_cast<int64_t>(options.weight.size()) != logits.size(1)) {
        throw config_error(
            "LOSS.cross_entropy_multiple_output_single_target.weight",
            fmt::format("{} weights", options.weight.size()),
            fmt::format("one weight per class ({})", logits.size(1)));
      }
      cross_entropy.weight(
          at::tensor(options.weight, logits.options().dtype(at::kDouble)).to(logits.scalar_type()));
    }
    at::Tensor loss = F::cross_entropy(logits, targets, cross_entropy);
    total = total.defined() ? total + loss : loss;
  }
  return total;
}

} // namespace largo::train
