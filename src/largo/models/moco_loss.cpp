#include <largo/models/moco_loss.h>

#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace largo::models {

at::Tensor moco_loss(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& queue,
    const MocoLossOptions& options) {
  if (query.dim() != 2 || key.sizes() != query.sizes() || queue.dim() != 2 ||
      queue.size(0) != query.size(1)) {
    throw Error(fmt::format(
        "moco_loss: query [{}], key [{}] and queue [{}] given; expected query and key [n, d] "
        "and the queue [d, K]",
        fmt::join(query.sizes(), ", "),
        fmt::join(key.sizes(), ", "),
        fmt::join(queue.sizes(), ", ")));
  }
  if (!(options.temperature > 0.0) || !std::isfinite(options.temperature)) {
    throw OptionError(
        "MocoLossOptions::temperature", fmt::format("{}", options.temperature), "a number > 0");
  }
  // F.normalize's eps, as VISSL's loss applies it to the queries.
  const at::Tensor q = query / query.norm(2, 1, /*keepdim=*/true).clamp_min(1e-12);
  const at::Tensor positive = (q * key.detach()).sum(1, /*keepdim=*/true); // [n, 1]
  // A copy, as VISSL's: the queue is written in place after the loss and before its backward,
  // which needs the values the loss saw.
  const at::Tensor negatives = at::mm(q, queue.detach().clone()); // [n, K]
  const at::Tensor logits = at::cat({positive, negatives}, 1) / options.temperature;
  // Cross-entropy with every label 0, averaged over the queries (nn.CrossEntropyLoss).
  return (logits.logsumexp(1) - logits.select(1, 0)).mean();
}

} // namespace largo::models
