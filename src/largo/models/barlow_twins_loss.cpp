#include <largo/models/barlow_twins_loss.h>

#include <largo/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>

#include <cmath>

namespace largo::models {
namespace {

constexpr double kNormalizeEps = 1e-5; // VISSL's BarlowTwinsCriterion.eps

// `stacked` averaged over the ranks of `group` (a copy; one all-reduce).
at::Tensor mean_over_ranks(const at::Tensor& stacked, comm::ProcessGroup& group) {
  at::Tensor total = stacked.contiguous().clone();
  group.all_reduce(total);
  return total / static_cast<double>(group.world_size());
}

comm::ProcessGroup& group_of(torch::autograd::AutogradContext* context) {
  // The group outlives the backward (the job's), so its address is kept; an IValue cannot
  // hold the object itself.
  return *reinterpret_cast<comm::ProcessGroup*>(context->saved_data["group"].toInt());
}

// VISSL's SyncNormalizeFunction: x normalised over dim 0 with the statistics of every rank's
// rows; the backward of a batch normalisation over those rows without an affine part.
class SyncNormalize : public torch::autograd::Function<SyncNormalize> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* context, const at::Tensor& x, comm::ProcessGroup* group) {
    context->saved_data["group"] = reinterpret_cast<int64_t>(group);
    const at::Tensor moments = mean_over_ranks(at::stack({x.mean(0), x.pow(2).mean(0)}), *group);
    const at::Tensor mean = moments[0];
    const at::Tensor var = moments[1] - mean.pow(2);
    context->save_for_backward({x, mean, var});
    return (x - mean) / at::sqrt(var + kNormalizeEps);
  }

  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list gradients) {
    const auto saved = context->get_saved_variables();
    const at::Tensor& dy = gradients[0];
    const at::Tensor centered = saved[0] - saved[1];
    const at::Tensor& var = saved[2];
    const at::Tensor sums =
        mean_over_ranks(at::stack({dy.mean(0), (dy * centered).mean(0)}), group_of(context));
    const at::Tensor dx =
        (dy - sums[0] - centered / (var + kNormalizeEps) * sums[1]) / at::sqrt(var + kNormalizeEps);
    return {dx, at::Tensor()};
  }
};

// The sum over the ranks in the forward; the gradient passed through unchanged (VISSL's
// in-place all_reduce, which autograd does not see).
class SumOverRanksForward : public torch::autograd::Function<SumOverRanksForward> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* /*context*/,
      const at::Tensor& x,
      comm::ProcessGroup* group) {
    at::Tensor total = x.contiguous().clone();
    group->all_reduce(total);
    return total;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* /*context*/, torch::autograd::variable_list gradients) {
    return {gradients[0], at::Tensor()};
  }
};

// The off-diagonal elements of a square matrix, flattened (BarlowTwinsCriterion._off_diagonal).
at::Tensor off_diagonal(const at::Tensor& square) {
  const int64_t n = square.size(0);
  return square.flatten().narrow(0, 0, n * n - 1).view({n - 1, n + 1}).narrow(1, 1, n).flatten();
}

void check_options(const BarlowTwinsLossOptions& options) {
  if (!(options.lambda >= 0.0) || !std::isfinite(options.lambda)) {
    throw OptionError(
        "BarlowTwinsLossOptions::lambda", fmt::format("{}", options.lambda), "a number >= 0");
  }
  if (!(options.scale_loss > 0.0) || !std::isfinite(options.scale_loss)) {
    throw OptionError(
        "BarlowTwinsLossOptions::scale_loss",
        fmt::format("{}", options.scale_loss),
        "a number > 0");
  }
}

} // namespace

at::Tensor barlow_twins_loss(
    const at::Tensor& embeddings,
    comm::ProcessGroup& group,
    const BarlowTwinsLossOptions& options) {
  if (embeddings.dim() != 2 || embeddings.size(0) < 2 || embeddings.size(0) % 2 != 0) {
    throw Error(fmt::format(
        "barlow_twins_loss: embeddings of shape {} given; expected [2n, d]: two views of each "
        "of n images, view 0 of all n first",
        fmt::join(embeddings.sizes(), "x")));
  }
  check_options(options);
  const int64_t images = embeddings.size(0) / 2;
  const at::Tensor normalized = SyncNormalize::apply(embeddings, &group);
  const at::Tensor a = normalized.narrow(0, 0, images);
  const at::Tensor b = normalized.narrow(0, images, images);
  const at::Tensor local = at::mm(a.t(), b) / static_cast<double>(images);
  const at::Tensor correlation =
      group.world_size() == 1
          ? local
          : SumOverRanksForward::apply(local, &group) / static_cast<double>(group.world_size());
  const at::Tensor on_diagonal = (correlation.diagonal() - 1).pow(2).sum() * options.scale_loss;
  const at::Tensor off = off_diagonal(correlation).pow(2).sum() * options.scale_loss;
  return on_diagonal + options.lambda * off;
}

} // namespace largo::models
