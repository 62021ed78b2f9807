#include <largo/parallel/data_parallel/sync_batch_norm.h>

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/models/module_swap.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/nn/functional/batchnorm.h>

#include <algorithm>
#include <utility>
#include <vector>

// libtorch defines BatchNormImplBase<D>::pretty_print in its .cpp and does not export it; the
// construction vtables of a class derived from BatchNorm2dImpl still name it, so it is
// defined here (as torch prints a BatchNorm2d).
template <>
void torch::nn::BatchNormImplBase<2, torch::nn::BatchNorm2dImpl>::pretty_print(
    std::ostream& stream) const {
  stream << "torch::nn::BatchNorm2d(" << options.num_features() << ", eps=" << options.eps()
         << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

namespace largo::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The ranks one rank shares statistics with, and the all-reduce among them.
struct StatsGroup {
  std::shared_ptr<comm::ProcessGroup> group;
  int64_t group_size = 0; // ranks per group (>= 1), already capped at the world size

  int64_t world_size() const {
    return group->world_size();
  }
  int64_t index() const {
    return group->rank() / group_size;
  }
  int64_t num_groups() const {
    return (world_size() + group_size - 1) / group_size;
  }
  int64_t num_ranks() const {
    return std::min(group_size, world_size() - index() * group_size);
  }
  // Sums `values` (1-D) over the ranks of this rank's group, in place. One all-reduce over
  // the whole process group: each group's sums travel in its own row.
  void all_reduce(at::Tensor& values) const {
    if (num_groups() == 1) {
      group->all_reduce(values);
      return;
    }
    at::Tensor rows = at::zeros({num_groups(), values.numel()}, values.options());
    rows[index()].copy_(values);
    group->all_reduce(rows);
    values.copy_(rows[index()]);
  }
};

// What the backward needs besides the saved tensors.
struct SyncState : torch::CustomClassHolder {
  StatsGroup stats_group;
  double count = 0; // values per channel over the group
};

at::ScalarType compute_dtype(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::vector<int64_t> reduce_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) {
    dims.push_back(d);
  }
  return dims;
}

// [C] -> [1, C, 1, ...] to broadcast against the input.
at::Tensor per_channel(const at::Tensor& values, const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = values.numel();
  return values.reshape(shape);
}

struct GroupStats {
  at::Tensor mean;  // [C], compute dtype
  at::Tensor var;   // [C], biased, compute dtype
  double count = 0; // values per channel over the group
};

// The group's per-channel mean and biased variance (a collective). The local sums come from
// a local mean and variance (accurate in float32) and are combined in float64, so
// sum_sq / n - mean^2 does not cancel.
GroupStats group_stats(const at::Tensor& input, const StatsGroup& stats_group) {
  torch::NoGradGuard no_grad;
  const int64_t channels = input.size(1);
  const double local_count = input.numel() > 0 ? static_cast<double>(input.numel() / channels) : 0;
  at::Tensor sums = at::zeros({2 * channels + 1}, input.options().dtype(at::kDouble));
  if (local_count > 0) {
    auto [var, mean] = at::var_mean(
        input.to(compute_dtype(input)),
        reduce_dims(input),
        /*unbiased=*/false);
    at::Tensor mean64 = mean.to(at::kDouble);
    sums.narrow(0, 0, channels).copy_(mean64 * local_count);
    sums.narrow(0, channels, channels).copy_((var.to(at::kDouble) + mean64 * mean64) * local_count);
    sums[2 * channels].fill_(local_count);
  }
  stats_group.all_reduce(sums);
  GroupStats stats;
  stats.count = sums[2 * channels].item<double>();
  if (stats.count <= 1) {
    throw Error(fmt::format(
        "SyncBatchNorm: expected more than 1 value per channel when training, got {} over the "
        "{} rank(s) of the group (input of shape [{}])",
        stats.count,
        stats_group.num_ranks(),
        fmt::join(input.sizes(), ", ")));
  }
  at::Tensor mean = sums.narrow(0, 0, channels) / stats.count;
  at::Tensor var = (sums.narrow(0, channels, channels) / stats.count - mean * mean).clamp_min_(0);
  stats.mean = mean.to(compute_dtype(input));
  stats.var = var.to(compute_dtype(input));
  return stats;
}

// y = (x - mean) * invstd * weight + bias with the group's statistics; the backward
// all-reduces the sums that couple the ranks' inputs.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weight,
      const at::Tensor& bias,
      const at::Tensor& mean,
      const at::Tensor& invstd,
      const c10::intrusive_ptr<SyncState>& state) {
    const auto dtype = compute_dtype(input);
    at::Tensor scale = weight.defined() ? invstd * weight.to(dtype) : invstd;
    at::Tensor shift = -mean * scale;
    if (bias.defined()) {
      shift = shift + bias.to(dtype);
    }
    at::Tensor output =
        at::addcmul(per_channel(shift, input), input.to(dtype), per_channel(scale, input));
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return output.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    auto state =
        c10::static_intrusive_pointer_cast<SyncState>(ctx->saved_data["state"].toCapsule());
    const auto dtype = compute_dtype(input);
    const auto dims = reduce_dims(input);
    at::Tensor dy = grad_outputs[0].to(dtype);
    at::Tensor xmu = input.to(dtype) - per_channel(mean, input);
    at::Tensor sum_dy = dy.sum(dims);
    at::Tensor sum_dy_xmu = (dy * xmu).sum(dims);

    at::Tensor grad_input, grad_weight, grad_bias;
    if (weight.defined() && ctx->needs_input_grad(1)) {
      grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    }
    if (weight.defined() && ctx->needs_input_grad(2)) {
      grad_bias = sum_dy.to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      const int64_t channels = sum_dy.numel();
      at::Tensor sums = at::cat({sum_dy, sum_dy_xmu});
      state->stats_group.all_reduce(sums);
      at::Tensor mean_dy = sums.narrow(0, 0, channels) / state->count;
      at::Tensor mean_dy_xmu = sums.narrow(0, channels, channels) / state->count;
      at::Tensor scale = weight.defined() ? invstd * weight.to(dtype) : invstd;
      // (dy - mean(dy) - (x - mean) * invstd^2 * mean(dy * (x - mean))) * invstd * weight
      grad_input = (dy - per_channel(mean_dy, input) -
                    xmu * per_channel(invstd * invstd * mean_dy_xmu, input)) *
                   per_channel(scale, input);
      grad_input = grad_input.to(input.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

} // namespace

SyncBatchNormImpl::SyncBatchNormImpl(
    const torch::nn::BatchNormOptions& options,
    std::shared_ptr<comm::ProcessGroup> group,
    int64_t group_size)
    : torch::nn::BatchNorm2dImpl(options), group_(std::move(group)) {
  if (!group_) {
    throw Error("SyncBatchNorm needs a process group (comm::ProcessGroup::single_process() for "
                "one process)");
  }
  if (group_size < 0) {
    throw OptionError(
        "SyncBatchNorm::group_size",
        std::to_string(group_size),
        "0 (all ranks) or a number of ranks > 0");
  }
  const int64_t world = group_->world_size();
  group_size_ = group_size == 0 ? world : std::min(group_size, world);
}

int64_t SyncBatchNormImpl::group_first_rank() const {
  return group_->rank() / group_size_ * group_size_;
}

int64_t SyncBatchNormImpl::group_num_ranks() const {
  return StatsGroup{group_, group_size_}.num_ranks();
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2) {
    throw Error(fmt::format(
        "SyncBatchNorm expects an input of 2 or more dimensions [b, c, ...], "
        "got shape [{}]",
        fmt::join(input.sizes(), ", ")));
  }
  // torch's exponential_average_factor: momentum, or 1 / batches seen when it is None.
  double factor = 0.0;
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked.add_(1);
    factor = options.momentum().has_value()
                 ? *options.momentum()
                 : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  StatsGroup stats_group{group_, group_size_};
  if (!is_training() || group_size_ == 1) {
    // Evaluation (running statistics, or local batch statistics without them), or every
    // rank alone in its group: torch's own batch_norm. (A rank alone in a smaller last group
    // still takes part in the all-reduce the other groups' sums travel in.)
    const bool use_batch_stats = is_training() || !options.track_running_stats();
    return torch::batch_norm(
        input,
        weight,
        bias,
        running_mean,
        running_var,
        use_batch_stats,
        factor,
        options.eps(),
        /*cudnn_enabled=*/true);
  }
  GroupStats stats = group_stats(input, stats_group);
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    const double unbiased = stats.count / (stats.count - 1);
    running_mean.mul_(1.0 - factor).add_(stats.mean.to(running_mean.scalar_type()), factor);
    running_var.mul_(1.0 - factor).add_(stats.var.to(running_var.scalar_type()), factor * unbiased);
  }
  at::Tensor invstd = (stats.var + options.eps()).rsqrt();
  auto state = c10::make_intrusive<SyncState>();
  state->stats_group = stats_group;
  state->count = stats.count;
  return SyncBatchNormFunction::apply(input, weight, bias, stats.mean, invstd, state);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "largo::parallel::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ", ranks=[" << group_first_rank() << ", "
         << group_first_rank() + group_num_ranks() << "))";
}

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    const std::shared_ptr<torch::nn::Module>& module,
    std::shared_ptr<comm::ProcessGroup> group,
    int64_t group_size) {
  // BatchNorm1d and BatchNorm2d share their options and tensors but not a class: one
  // conversion for either.
  auto convert = [&](auto& batch_norm) -> torch::nn::AnyModule {
    auto sync = std::make_shared<SyncBatchNormImpl>(batch_norm.options, group, group_size);
    // Same storage as the old layer's tensors: the state is kept, not copied.
    auto adopt = [](at::Tensor& target, const at::Tensor& source) {
      if (target.defined() && source.defined()) {
        target.set_data(source);
        if (source.is_leaf() && source.requires_grad() != target.requires_grad()) {
          target.set_requires_grad(source.requires_grad());
        }
      }
    };
    adopt(sync->weight, batch_norm.weight);
    adopt(sync->bias, batch_norm.bias);
    adopt(sync->running_mean, batch_norm.running_mean);
    adopt(sync->running_var, batch_norm.running_var);
    adopt(sync->num_batches_tracked, batch_norm.num_batches_tracked);
    sync->train(batch_norm.is_training());
    return torch::nn::AnyModule(sync);
  };
  auto replace = [&](const std::string&, torch::nn::Module& candidate) -> torch::nn::AnyModule {
    if (dynamic_cast<SyncBatchNormImpl*>(&candidate) != nullptr) {
      return {};
    }
    if (auto* batch_norm = dynamic_cast<torch::nn::BatchNorm2dImpl*>(&candidate)) {
      return convert(*batch_norm);
    }
    if (auto* batch_norm = dynamic_cast<torch::nn::BatchNorm1dImpl*>(&candidate)) {
      return convert(*batch_norm);
    }
    return {};
  };
  return models::swap_modules(module, replace);
}

int64_t
sync_bn_group_size(int64_t config_group_size, int64_t num_proc_per_node, int64_t world_size) {
  if (config_group_size < -1) {
    throw OptionError(
        "SyncBatchNorm::group_size",
        std::to_string(config_group_size),
        "-1 (the ranks of one machine), 0 (all ranks) or a number of ranks > 0");
  }
  if (config_group_size == 0) {
    return 0;
  }
  const int64_t size = config_group_size == -1 ? num_proc_per_node : config_group_size;
  return std::min(size, world_size);
}

} // namespace largo::parallel
