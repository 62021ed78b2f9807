#include <largo/models/norm_layers.h>

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/models/module_swap.h>

#include <fmt/format.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/normalization.h>

namespace largo::models {
namespace {

}

void validate_norm_options(const NormOptions& options) {
  if (options.type != "BatchNorm" && options.type != "GroupNorm" && options.type != "LayerNorm") {
    throw OptionError("NormOptions::type", options.type, "BatchNorm, GroupNorm or LayerNorm");
  }
  if (options.type == "GroupNorm" && options.groupnorm_groups <= 0) {
    throw OptionError(
        "NormOptions::groupnorm_groups",
        std::to_string(options.groupnorm_groups),
        "an integer > 0");
  }
}

torch::nn::AnyModule make_norm2d(const NormOptions& options, int64_t channels) {
  validate_norm_options(options);
  if (options.type == "BatchNorm") {
    return torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
  }
  const int64_t groups = options.type == "LayerNorm" ? 1 : options.groupnorm_groups;
  if (channels % groups != 0) {
    throw OptionError(
        "NormOptions::groupnorm_groups",
        std::to_string(groups),
        fmt::format("a divisor of every norm layer's channel count (this one has {})", channels));
  }
  // torch.nn.GroupNorm's defaults: eps 1e-5, affine weight 1 and bias 0.
  return torch::nn::AnyModule(torch::nn::GroupNorm(groups, channels));
}

at::Tensor norm_weight(const torch::nn::AnyModule& norm) {
  at::Tensor weight = direct_tensor(*norm.ptr(), "weight");
  if (!weight.defined()) {
    throw Error(fmt::format("norm layer {} has no affine weight", norm.ptr()->name()));
  }
  return weight;
}

} // namespace largo::models
