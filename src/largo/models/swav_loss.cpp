#include <largo/models/swav_loss.h>

#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace largo::models {
namespace {

// Infinite entries (exp overflowed) become the largest of the others and 0, as VISSL's
// does; without branching on the data, which on a GPU would wait for it every iteration.
at::Tensor without_infinities(const at::Tensor& values) {
  const at::Tensor infinite = values.isinf();
  return at::where(infinite, values.masked_fill(infinite, 0).max(), values);
}

void check_swav_options(const SwavLossOptions& options) {
  require_option(
      options.temperature > 0 && std::isfinite(options.temperature),
      "SwavLossOptions::temperature",
      fmt::format("{}", options.temperature),
      "a number > 0");
  require_option(
      options.epsilon > 0 && std::isfinite(options.epsilon),
      "SwavLossOptions::epsilon",
      fmt::format("{}", options.epsilon),
      "a number > 0");
  require_option(
      options.num_iters >= 1,
      "SwavLossOptions::num_iters",
      std::to_string(options.num_iters),
      "an integer >= 1");
  require_option(
      options.num_crops >= 2,
      "SwavLossOptions::num_crops",
      std::to_string(options.num_crops),
      "an integer >= 2");
  bool crops_valid = !options.crops_for_assign.empty();
  for (int64_t crop : options.crops_for_assign) {
    crops_valid = crops_valid && crop >= 0 && crop < options.num_crops;
  }
  require_option(
      crops_valid,
      "SwavLossOptions::crops_for_assign",
      fmt::format("[{}]", fmt::join(options.crops_for_assign, ", ")),
      fmt::format(
          "a non-empty list of crop indices below SwavLossOptions::num_crops = {}",
          options.num_crops));
}

// exp(scores / epsilon), transposed to [K, n + q]: in float64 directly (VISSL's double
// precision), else after subtracting the largest score of every rank.
at::Tensor exponentiated_scores(
    const at::Tensor& scores, const SwavLossOptions& options, comm::ProcessGroup& group) {
  if (options.use_double_precision) {
    return (scores.to(at::kDouble) / options.epsilon).exp().t().contiguous();
  }
  at::Tensor scaled = scores / options.epsilon;
  at::Tensor maximum = scaled.max().reshape({1});
  group.all_reduce(maximum, comm::ReduceOp::kMax);
  return (scaled - maximum).exp().t().contiguous();
}

} // namespace

at::Tensor distributed_sinkhorn(
    at::Tensor q, int64_t num_iters, bool hard_assignment, comm::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  q = without_infinities(q);
  at::Tensor total = q.sum().reshape({1});
  group.all_reduce(total);
  q = q / total;
  const int64_t prototypes = q.size(0);
  const int64_t columns = q.size(1) * group.world_size();
  const double row_target = 1.0 / static_cast<double>(prototypes);
  const double column_target = 1.0 / static_cast<double>(columns);
  for (int64_t iteration = 0; iteration < num_iters; ++iteration) {
    at::Tensor rows = q.sum(1);
    group.all_reduce(rows);
    // Every rank sees the same sums, so all take this branch or none (a wait on the data,
    // kept: its alternative is a second all-reduce on every iteration).
    if ((rows == 0).any().item<bool>()) {
      q = q + 1e-12;
      rows = q.sum(1);
      group.all_reduce(rows);
    }
    q = q * without_infinities(row_target / rows).unsqueeze(1);
    q = q * (column_target / q.sum(0)).unsqueeze(0);
  }
  at::Tensor assignments = (q / q.sum(0, /*keepdim=*/true)).t().to(at::kFloat);
  if (hard_assignment) {
    const at::Tensor best = assignments.argmax(1, /*keepdim=*/true);
    assignments = at::zeros_like(assignments).scatter_(1, best, 1.0);
  }
  return assignments;
}

at::Tensor swav_loss(
    const at::Tensor& scores,
    comm::ProcessGroup& group,
    const SwavLossOptions& options,
    const std::vector<at::Tensor>& queue_scores,
    bool hard_assignment) {
  check_swav_options(options);
  if (scores.dim() != 2 || scores.size(0) == 0 || scores.size(0) % options.num_crops != 0) {
    throw Error(fmt::format(
        "swav_loss: scores of shape {} given; expected [num_crops * n, prototypes] with "
        "num_crops = {}",
        fmt::join(scores.sizes(), "x"),
        options.num_crops));
  }
  if (!queue_scores.empty() && queue_scores.size() != options.crops_for_assign.size()) {
    throw Error(fmt::format(
        "swav_loss: {} queue score tensors given for {} crops_for_assign",
        queue_scores.size(),
        options.crops_for_assign.size()));
  }
  const int64_t images = scores.size(0) / options.num_crops;
  auto crop = [&](int64_t index) { return scores.narrow(0, index * images, images); };
  at::Tensor total;
  for (size_t i = 0; i < options.crops_for_assign.size(); ++i) {
    const int64_t assigned = options.crops_for_assign[i];
    at::Tensor assignments;
    {
      at::NoGradGuard no_grad;
      at::Tensor assigned_scores = crop(assigned).detach();
      if (!queue_scores.empty()) {
        assigned_scores = at::cat({assigned_scores, queue_scores[i].to(scores.dtype())});
      }
      assignments = distributed_sinkhorn(
                        exponentiated_scores(assigned_scores, options, group),
                        options.num_iters,
                        hard_assignment,
                        group)
                        .narrow(0, 0, images);
    }
    at::Tensor loss;
    for (int64_t predicting = 0; predicting < options.num_crops; ++predicting) {
      if (predicting == assigned) {
        continue;
      }
      at::Tensor log_probabilities =
          options.use_double_precision
              ? (crop(predicting).to(at::kDouble) / options.temperature).log_softmax(1)
              : (crop(predicting) / options.temperature).log_softmax(1);
      // Summed in the assignments' dtype (float32), as VISSL's sum(..., dtype=...) does.
      at::Tensor term = -(assignments * log_probabilities).sum(1, false, at::kFloat).mean();
      loss = loss.defined() ? loss + term : term;
    }
    loss = loss / static_cast<double>(options.num_crops - 1);
    total = total.defined() ? total + loss : loss;
  }
  return total / static_cast<double>(options.crops_for_assign.size());
}

} // namespace largo::models
