#include <largo/models/resnet.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/conv.h>

namespace largo::models {
namespace {

const std::string kKey = "MODEL.TRUNK.RESNETS.";

torch::nn::Conv2d
conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride)
                               .padding(kernel / 2)
                               .groups(groups)
                               .bias(false));
}

// The 1x1 conv + BN shortcut torchvision uses when the shape changes.
torch::nn::Sequential projection_shortcut(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Sequential(conv(in, out, 1, stride), torch::nn::BatchNorm2d(out));
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
    }
  }
}

void validate(const ResNetOptions& options, int64_t in_channels) {
  resnet_stage_sizes(options.depth); // throws for an unsupported depth
  if (options.stem != "imagenet" && options.stem != "cifar") {
    throw config_error(kKey + "STEM", options.stem, "\"imagenet\" or \"cifar\"");
  }
  if (options.width_multiplier <= 0) {
    throw config_error(
        kKey + "WIDTH_MULTIPLIER", std::to_string(options.width_multiplier), "an integer >= 1");
  }
  if (options.groups <= 0) {
    throw config_error(kKey + "GROUPS", std::to_string(options.groups), "an integer >= 1");
  }
  if (options.width_per_group <= 0) {
    throw config_error(
        kKey + "WIDTH_PER_GROUP", std::to_string(options.width_per_group), "an integer >= 1");
  }
  if (resnet_expansion(options.depth) == 1 &&
      (options.groups != 1 || options.width_per_group != 64)) {
    throw config_error(
        kKey + "GROUPS",
        fmt::format("{} (WIDTH_PER_GROUP {})", options.groups, options.width_per_group),
        fmt::format(
            "GROUPS 1 and WIDTH_PER_GROUP 64 for depth {}: BasicBlock has no grouped "
            "convolutions (use depth 50 or more for ResNeXt)",
            options.depth));
  }
  if (options.layer4_stride != 1 && options.layer4_stride != 2) {
    throw config_error(kKey + "LAYER4_STRIDE", std::to_string(options.layer4_stride), "1 or 2");
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
    throw config_error(kKey + "DEPTH", std::to_string(depth), "one of 18, 34, 50, 101, 152, 200");
  }
}

int64_t resnet_expansion(int64_t depth) {
  resnet_stage_sizes(depth);
  return depth < 50 ? BasicBlockImpl::kExpansion : BottleneckImpl::kExpansion;
}

ResNetStemImpl::ResNetStemImpl(int64_t in_channels, int64_t out_channels, bool imagenet_stem)
    : use_max_pool_(imagenet_stem) {
  conv1_ = register_module(
      "conv1",
      imagenet_stem ? conv(in_channels, out_channels, 7, 2)
                    : conv(in_channels, out_channels, 3, 1));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(out_channels));
}

at::Tensor ResNetStemImpl::forward(at::Tensor x) {
  x = bn1_(conv1_(x)).relu_();
  if (use_max_pool_) {
    x = torch::max_pool2d(x, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
  }
  return x;
}

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t planes, int64_t stride) {
  conv1_ = register_module("conv1", conv(in_channels, planes, 3, stride));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(planes));
  conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
  bn2_ = register_module("bn2", torch::nn::BatchNorm2d(planes));
  const int64_t out_channels = planes * kExpansion;
  if (needs_projection(in_channels, out_channels, stride)) {
    downsample_ =
        register_module("downsample", projection_shortcut(in_channels, out_channels, stride));
  }
}

at::Tensor BasicBlockImpl::forward(at::Tensor x) {
  at::Tensor identity = downsample_ ? downsample_->forward(x) : x;
  at::Tensor out = bn1_(conv1_(x)).relu_();
  out = bn2_(conv2_(out));
  out += identity;
  return out.relu_();
}

BottleneckImpl::BottleneckImpl(
    int64_t in_channels, int64_t planes, int64_t stride, int64_t groups, int64_t width_per_group) {
  // torchvision: width = int(planes * (base_width / 64.)) * groups
  const int64_t width = planes * width_per_group / 64 * groups;
  const int64_t out_channels = planes * kExpansion;
  conv1_ = register_module("conv1", conv(in_channels, width, 1, 1));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(width));
  conv2_ = register_module("conv2", conv(width, width, 3, stride, groups));
  bn2_ = register_module("bn2", torch::nn::BatchNorm2d(width));
  conv3_ = register_module("conv3", conv(width, out_channels, 1, 1));
  bn3_ = register_module("bn3", torch::nn::BatchNorm2d(out_channels));
  if (needs_projection(in_channels, out_channels, stride)) {
    downsample_ =
        register_module("downsample", projection_shortcut(in_channels, out_channels, stride));
  }
}

at::Tensor BottleneckImpl::forward(at::Tensor x) {
  at::Tensor identity = downsample_ ? downsample_->forward(x) : x;
  at::Tensor out = bn1_(conv1_(x)).relu_();
  out = bn2_(conv2_(out)).relu_();
  out = bn3_(conv3_(out));
  out += identity;
  return out.relu_();
}

at::Tensor GlobalAvgPoolImpl::forward(at::Tensor x) {
  // [b, c, h, w] -> [b, c]; mean over h, w equals adaptive_avg_pool2d(x, 1).flatten(1).
  return torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
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
  validate(options, in_channels);
  const int64_t expansion = resnet_expansion(options.depth);
  const bool bottleneck = expansion == BottleneckImpl::kExpansion;

  torch::nn::Sequential blocks;
  blocks->push_back(
      ResNetStem(in_channels, resnet_stem_channels(options), options.stem == "imagenet"));
  std::vector<torch::nn::BatchNorm2d> last_bns;
  int64_t channels = resnet_stem_channels(options);
  for (const ResNetBlockSpec& spec : resnet_blocks(options)) {
    if (bottleneck) {
      Bottleneck block(
          spec.in_channels, spec.planes, spec.stride, options.groups, options.width_per_group);
      last_bns.push_back(block->last_bn());
      blocks->push_back(block);
    } else {
      BasicBlock block(spec.in_channels, spec.planes, spec.stride);
      last_bns.push_back(block->last_bn());
      blocks->push_back(block);
    }
    channels = spec.planes * expansion;
  }
  blocks->push_back(GlobalAvgPool());

  init_like_torchvision(*blocks);
  if (options.zero_init_residual) {
    torch::NoGradGuard no_grad;
    for (auto& bn : last_bns) {
      bn->weight.zero_();
    }
  }
  return Trunk{blocks, channels};
}

} // namespace largo::models
