#include <largo/models/resnet.h>

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/models/norm_relu.h>

#include <fmt/format.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>

#include <cstdio>
#include <initializer_list>
#include <utility>

namespace largo::models {
namespace {

const std::string kResNetOptions = "ResNetOptions::";

torch::nn::Conv2d
conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride)
                               .padding(kernel / 2)
                               .groups(groups)
                               .bias(false));
}

// The 1x1 conv + norm shortcut torchvision uses when the shape changes.
torch::nn::Sequential
projection_shortcut(int64_t in, int64_t out, int64_t stride, const NormOptions& norm) {
  torch::nn::Sequential shortcut;
  shortcut->push_back(conv(in, out, 1, stride));
  shortcut->push_back(make_norm2d(norm, out));
  return shortcut;
}

// Registers `norm` as child `name` and returns it (the member that calls it).
torch::nn::AnyModule
register_norm(torch::nn::Module& parent, const std::string& name, torch::nn::AnyModule norm) {
  parent.register_module(name, norm.ptr());
  return norm;
}

// SwappableChildren for the blocks: `name` is one of the norm `members` (swapped for a plain
// module) or the "downsample" Sequential.
void swap_member(
    torch::nn::Module& parent,
    const std::string& name,
    const SwappedModule& replacement,
    std::initializer_list<std::pair<const char*, torch::nn::AnyModule*>> members,
    torch::nn::Sequential* downsample = nullptr) {
  if (name == "downsample" && downsample != nullptr && *downsample && replacement.sequential) {
    parent.replace_module(name, replacement.sequential.ptr());
    *downsample = replacement.sequential;
    return;
  }
  for (const auto& [member_name, member] : members) {
    if (name == member_name && !replacement.any.is_empty()) {
      parent.replace_module(name, replacement.any.ptr());
      *member = replacement.any;
      return;
    }
  }
  throw Error(fmt::format(
      "{} cannot swap its child {} for a {}", parent.name(), name, replacement.module()->name()));
}

at::Tensor shortcut(torch::nn::Sequential& downsample, const at::Tensor& x) {
  return downsample ? downsample->forward(x) : x;
}

bool needs_projection(int64_t in, int64_t out, int64_t stride) {
  return stride != 1 || in != out;
}

// torchvision's ResNet init: convs kaiming-normal (fan_out, ReLU gain), norms weight 1 bias 0.
void init_like_torchvision(torch::nn::Module& trunk) {
  torch::NoGradGuard no_grad;
  for (auto& module : trunk.modules(/*include_self=*/false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
      torch::nn::init::ones_(bn->weight);
      torch::nn::init::zeros_(bn->bias);
    } else if (auto* gn = module->as<torch::nn::GroupNorm>()) {
      torch::nn::init::ones_(gn->weight);
      torch::nn::init::zeros_(gn->bias);
    }
  }
}

void validate_resnet(const ResNetOptions& options, int64_t in_channels) {
  resnet_stage_sizes(options.depth); // throws for an unsupported depth
  if (options.stem != "imagenet" && options.stem != "cifar") {
    throw OptionError(kResNetOptions + "stem", options.stem, "\"imagenet\" or \"cifar\"");
  }
  if (options.width_multiplier <= 0) {
    throw OptionError(
        kResNetOptions + "width_multiplier",
        std::to_string(options.width_multiplier),
        "an integer >= 1");
  }
  if (options.groups <= 0) {
    throw OptionError(kResNetOptions + "groups", std::to_string(options.groups), "an integer >= 1");
  }
  if (options.width_per_group <= 0) {
    throw OptionError(
        kResNetOptions + "width_per_group",
        std::to_string(options.width_per_group),
        "an integer >= 1");
  }
  if (resnet_expansion(options.depth) == 1 &&
      (options.groups != 1 || options.width_per_group != 64)) {
    throw OptionError(
        kResNetOptions + "groups",
        fmt::format(
            "{} (ResNetOptions::width_per_group {})", options.groups, options.width_per_group),
        fmt::format(
            "ResNetOptions::groups 1 and ResNetOptions::width_per_group 64 for depth {}: "
            "BasicBlock has no grouped convolutions (use depth 50 or more for ResNeXt)",
            options.depth));
  }
  validate_norm_options(options.norm);
  if (options.layer4_stride != 1 && options.layer4_stride != 2) {
    throw OptionError(
        kResNetOptions + "layer4_stride", std::to_string(options.layer4_stride), "1 or 2");
  }
  if (in_channels <= 0) {
    throw ConfigError(fmt::format("ResNet input channels must be > 0, got {}", in_channels));
  }
}

} // namespace

std::vector<int64_t> resnet_stage_sizes(int64_t depth) {
  switch (depth) {
  case 18:
    return {2, 2, 2, 2};
  case 34:
  case 50:
    return {3, 4, 6, 3};
  case 101:
    return {3, 4, 23, 3};
  case 152:
    return {3, 8, 36, 3};
  case 200:
    return {3, 24, 36, 3};
  default:
    throw OptionError(
        kResNetOptions + "depth", std::to_string(depth), "one of 18, 34, 50, 101, 152, 200");
  }
}

int64_t resnet_expansion(int64_t depth) {
  resnet_stage_sizes(depth);
  return depth < 50 ? BasicBlockImpl::kExpansion : BottleneckImpl::kExpansion;
}

ResNetStemImpl::ResNetStemImpl(
    int64_t in_channels, int64_t out_channels, bool imagenet_stem, const NormOptions& norm)
    : use_max_pool_(imagenet_stem), fuse_relu_(norm.fuse_relu) {
  conv1_ = register_module(
      "conv1",
      imagenet_stem ? conv(in_channels, out_channels, 7, 2)
                    : conv(in_channels, out_channels, 3, 1));
  bn1_ = register_norm(*this, "bn1", make_norm2d(norm, out_channels));
}

at::Tensor ResNetStemImpl::forward(at::Tensor x) {
  return forward_pool(forward_conv(std::move(x)));
}

at::Tensor ResNetStemImpl::forward_conv(at::Tensor x) {
  return norm_relu(bn1_, conv1_(x), fuse_relu_);
}

at::Tensor ResNetStemImpl::forward_pool(at::Tensor x) {
  if (use_max_pool_) {
    x = torch::max_pool2d(x, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
  }
  return x;
}

void ResNetStemImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_member(*this, name, replacement, {{"bn1", &bn1_}});
}

BasicBlockImpl::BasicBlockImpl(
    int64_t in_channels, int64_t planes, int64_t stride, const NormOptions& norm)
    : fuse_relu_(norm.fuse_relu) {
  conv1_ = register_module("conv1", conv(in_channels, planes, 3, stride));
  bn1_ = register_norm(*this, "bn1", make_norm2d(norm, planes));
  conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
  bn2_ = register_norm(*this, "bn2", make_norm2d(norm, planes));
  const int64_t out_channels = planes * kExpansion;
  if (needs_projection(in_channels, out_channels, stride)) {
    downsample_ =
        register_module("downsample", projection_shortcut(in_channels, out_channels, stride, norm));
  }
}

at::Tensor BasicBlockImpl::forward(at::Tensor x) {
  at::Tensor identity = shortcut(downsample_, x);
  at::Tensor out = norm_relu(bn1_, conv1_(x), fuse_relu_);
  return norm_add_relu(bn2_, conv2_(out), identity, fuse_relu_);
}

void BasicBlockImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_member(*this, name, replacement, {{"bn1", &bn1_}, {"bn2", &bn2_}}, &downsample_);
}

BottleneckImpl::BottleneckImpl(
    int64_t in_channels,
    int64_t planes,
    int64_t stride,
    int64_t groups,
    int64_t width_per_group,
    const NormOptions& norm)
    : fuse_relu_(norm.fuse_relu) {
  // torchvision: width = int(planes * (base_width / 64.)) * groups
  const int64_t width = planes * width_per_group / 64 * groups;
  const int64_t out_channels = planes * kExpansion;
  conv1_ = register_module("conv1", conv(in_channels, width, 1, 1));
  bn1_ = register_norm(*this, "bn1", make_norm2d(norm, width));
  conv2_ = register_module("conv2", conv(width, width, 3, stride, groups));
  bn2_ = register_norm(*this, "bn2", make_norm2d(norm, width));
  conv3_ = register_module("conv3", conv(width, out_channels, 1, 1));
  bn3_ = register_norm(*this, "bn3", make_norm2d(norm, out_channels));
  if (needs_projection(in_channels, out_channels, stride)) {
    downsample_ =
        register_module("downsample", projection_shortcut(in_channels, out_channels, stride, norm));
  }
}

at::Tensor BottleneckImpl::forward(at::Tensor x) {
  at::Tensor identity = shortcut(downsample_, x);
  at::Tensor out = norm_relu(bn1_, conv1_(x), fuse_relu_);
  out = norm_relu(bn2_, conv2_(out), fuse_relu_);
  return norm_add_relu(bn3_, conv3_(out), identity, fuse_relu_);
}

void BottleneckImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_member(
      *this, name, replacement, {{"bn1", &bn1_}, {"bn2", &bn2_}, {"bn3", &bn3_}}, &downsample_);
}

at::Tensor GlobalAvgPoolImpl::forward(at::Tensor x) {
  // [b, c, h, w] -> [b, c]; mean over h, w equals adaptive_avg_pool2d(x, 1).flatten(1).
  return torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
}

std::string resnet_name_from_torchvision(const std::string& name, int64_t depth) {
  auto strip = [](const std::string& text, const std::string& prefix, std::string& rest) {
    if (text.compare(0, prefix.size(), prefix) != 0) {
      return false;
    }
    rest = text.substr(prefix.size());
    return true;
  };
  std::string rest;
  const bool in_trunk = strip(name, "trunk._feature_blocks.", rest) ||
                        strip(name, "trunk.base_model._feature_blocks.", rest) ||
                        strip(name, "_feature_blocks.", rest);
  const std::string torchvision = in_trunk ? rest : name;
  if (strip(torchvision, "conv1.", rest) || strip(torchvision, "bn1.", rest)) {
    return "trunk.0." + torchvision;
  }
  if (!in_trunk && strip(torchvision, "fc.", rest)) {
    return "head.0." + rest;
  }
  // layer<s>.<i>.<rest>: block i of stage s (1-based), after the stem and earlier stages.
  int stage = 0;
  size_t consumed = 0;
  long long index = 0;
  if (std::sscanf(torchvision.c_str(), "layer%d.%lld.%zn", &stage, &index, &consumed) == 2 &&
      consumed > 0 && stage >= 1 && stage <= 4) {
    const std::vector<int64_t> sizes = resnet_stage_sizes(depth);
    if (index < sizes[static_cast<size_t>(stage - 1)]) {
      int64_t block = 1 + index;
      for (int s = 0; s + 1 < stage; ++s) {
        block += sizes[static_cast<size_t>(s)];
      }
      return fmt::format("trunk.{}.{}", block, torchvision.substr(consumed));
    }
  }
  return name;
}

int64_t resnet_stem_channels(const ResNetOptions& options) {
  return 64 * options.width_multiplier;
}

std::vector<ResNetBlockSpec> resnet_blocks(const ResNetOptions& options) {
  const std::vector<int64_t> stage_sizes = resnet_stage_sizes(options.depth);
  const int64_t expansion = resnet_expansion(options.depth);
  const int64_t base_width = resnet_stem_channels(options);
  std::vector<ResNetBlockSpec> blocks;
  int64_t channels = base_width;
  for (size_t stage = 0; stage < stage_sizes.size(); ++stage) {
    const int64_t planes = base_width << stage; // 64, 128, 256, 512 (times the multiplier)
    const int64_t stage_stride = stage == 0 ? 1 : (stage == 3 ? options.layer4_stride : 2);
    for (int64_t i = 0; i < stage_sizes[stage]; ++i) {
      blocks.push_back({channels, planes, i == 0 ? stage_stride : 1});
      channels = planes * expansion;
    }
  }
  return blocks;
}

Trunk build_resnet_trunk(const ResNetOptions& options, int64_t in_channels) {
  validate_resnet(options, in_channels);
  const int64_t expansion = resnet_expansion(options.depth);
  const bool bottleneck = expansion == BottleneckImpl::kExpansion;

  torch::nn::Sequential blocks;
  blocks->push_back(ResNetStem(
      in_channels, resnet_stem_channels(options), options.stem == "imagenet", options.norm));
  std::vector<at::Tensor> last_norm_weights;
  int64_t channels = resnet_stem_channels(options);
  for (const ResNetBlockSpec& spec : resnet_blocks(options)) {
    if (bottleneck) {
      Bottleneck block(
          spec.in_channels,
          spec.planes,
          spec.stride,
          options.groups,
          options.width_per_group,
          options.norm);
      last_norm_weights.push_back(norm_weight(block->last_norm()));
      blocks->push_back(block);
    } else {
      BasicBlock block(spec.in_channels, spec.planes, spec.stride, options.norm);
      last_norm_weights.push_back(norm_weight(block->last_norm()));
      blocks->push_back(block);
    }
    channels = spec.planes * expansion;
  }
  blocks->push_back(GlobalAvgPool());

  init_like_torchvision(*blocks);
  if (options.zero_init_residual) {
    torch::NoGradGuard no_grad;
    for (auto& weight : last_norm_weights) {
      weight.zero_();
    }
  }
  return Trunk{blocks, channels};
}

} // namespace largo::models
