#include <largo/models/resnet_sk.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/padding.h>
#include <torch/nn/modules/pooling.h>

#include <algorithm>
#include <cstdio>

namespace largo::models {
namespace {

// VISSL's conv(): padding (kernel - 1) / 2, no bias.
torch::nn::AnyModule
sk_conv(int64_t in_channels, int64_t out_channels, int64_t kernel_size = 3, int64_t stride = 1) {
  return torch::nn::AnyModule(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, out_channels, kernel_size)
                            .stride(stride)
                            .padding((kernel_size - 1) / 2)
                            .bias(false)));
}

// VISSL's BatchNormRelu: BatchNorm2d (eps 1e-5) "0", then ReLU or nothing (no parameters).
torch::nn::AnyModule sk_batch_norm_relu(int64_t channels, bool relu = true) {
  Chain chain;
  chain->push_back(torch::nn::AnyModule(
      torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(channels).eps(1e-5))));
  if (relu) {
    chain->push_back(torch::nn::AnyModule(torch::nn::ReLU()));
  }
  return torch::nn::AnyModule(chain);
}

// VISSL's Projection: the shortcut of a stage's first block, "shortcut" then "bn".
class SkProjectionImpl : public torch::nn::Module {
 public:
  SkProjectionImpl(int64_t in_channels, int64_t out_channels, int64_t stride, double sk_ratio) {
    if (sk_ratio > 0) {
      Chain shortcut; // zero pad right and bottom, so that the 2x2 pool sees every pixel
      shortcut->push_back(
          torch::nn::AnyModule(torch::nn::ZeroPad2d(torch::nn::ZeroPad2dOptions({0, 1, 0, 1}))));
      shortcut->push_back(torch::nn::AnyModule(
          torch::nn::AvgPool2d(torch::nn::AvgPool2dOptions(2).stride(stride).padding(0))));
      shortcut->push_back(sk_conv(in_channels, out_channels, 1));
      shortcut_ = torch::nn::AnyModule(shortcut);
    } else {
      shortcut_ = sk_conv(in_channels, out_channels, 1, stride);
    }
    register_module("shortcut", shortcut_.ptr());
    bn_ = sk_batch_norm_relu(out_channels, /*relu=*/false);
    register_module("bn", bn_.ptr());
  }
  at::Tensor forward(at::Tensor x) {
    return bn_.forward(shortcut_.forward(x));
  }

 private:
  torch::nn::AnyModule shortcut_;
  torch::nn::AnyModule bn_;
};
TORCH_MODULE(SkProjection);

// VISSL's Stem: three 3x3 convs with selective kernels, one 7x7 without; then max pool.
Chain sk_stem(int64_t in_channels, int64_t width_multiplier, double sk_ratio) {
  const int64_t channels = 64 * width_multiplier / 2;
  Chain chain;
  if (sk_ratio > 0) {
    chain->push_back(sk_conv(in_channels, channels, 3, 2));
    chain->push_back(sk_batch_norm_relu(channels));
    chain->push_back(sk_conv(channels, channels));
    chain->push_back(sk_batch_norm_relu(channels));
    chain->push_back(sk_conv(channels, channels * 2));
  } else {
    chain->push_back(sk_conv(in_channels, channels * 2, 7, 2));
  }
  chain->push_back(sk_batch_norm_relu(channels * 2));
  chain->push_back(torch::nn::AnyModule(
      torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1))));
  return chain;
}

// VISSL's forward ends in net(x).mean(dim=[2, 3]): [b, c, h, w] -> [b, c].
class SkSpatialMeanImpl : public torch::nn::Module {
 public:
  at::Tensor forward(at::Tensor x) {
    return x.mean({2, 3});
  }
};
TORCH_MODULE(SkSpatialMean);

} // namespace

void ChainImpl::push_back(torch::nn::AnyModule module) {
  register_module(std::to_string(modules_.size()), module.ptr());
  modules_.push_back(std::move(module));
}

at::Tensor ChainImpl::forward(at::Tensor x) {
  for (auto& module : modules_) {
    x = module.forward(x);
  }
  return x;
}

SelectiveKernelImpl::SelectiveKernelImpl(
    int64_t in_channels, int64_t out_channels, int64_t stride, double sk_ratio) {
  main_conv_ = register_module("main_conv", Chain());
  main_conv_->push_back(sk_conv(in_channels, 2 * out_channels, 3, stride));
  main_conv_->push_back(sk_batch_norm_relu(2 * out_channels));
  // VISSL: max(int(out_channels * sk_ratio), min_dim=32)
  const auto mid_channels =
      std::max<int64_t>(static_cast<int64_t>(static_cast<double>(out_channels) * sk_ratio), 32);
  mixing_conv_ = register_module("mixing_conv", Chain());
  mixing_conv_->push_back(sk_conv(out_channels, mid_channels, 1));
  mixing_conv_->push_back(sk_batch_norm_relu(mid_channels));
  mixing_conv_->push_back(sk_conv(mid_channels, 2 * out_channels, 1));
}

at::Tensor SelectiveKernelImpl::forward(at::Tensor x) {
  const at::Tensor halves = at::stack(main_conv_->forward(x).chunk(2, 1), 0); // [2, b, c, h, w]
  const at::Tensor pooled = halves.sum(0).mean({2, 3}, /*keepdim=*/true);     // [b, c, 1, 1]
  const at::Tensor mixing = at::stack(mixing_conv_->forward(pooled).chunk(2, 1), 0);
  return (halves * mixing.softmax(0)).sum(0); // [b, c, h, w]
}

SkBottleneckImpl::SkBottleneckImpl(
    int64_t in_channels, int64_t channels, int64_t stride, double sk_ratio, bool projection) {
  if (projection) {
    projection_ = torch::nn::AnyModule(SkProjection(in_channels, channels * 4, stride, sk_ratio));
    register_module("projection", projection_.ptr());
  }
  net_ = register_module("net", Chain());
  net_->push_back(sk_conv(in_channels, channels, 1));
  net_->push_back(sk_batch_norm_relu(channels));
  if (sk_ratio > 0) {
    net_->push_back(torch::nn::AnyModule(SelectiveKernel(channels, channels, stride, sk_ratio)));
  } else {
    net_->push_back(sk_conv(channels, channels, 3, stride));
    net_->push_back(sk_batch_norm_relu(channels));
  }
  net_->push_back(sk_conv(channels, channels * 4, 1));
  net_->push_back(sk_batch_norm_relu(channels * 4, /*relu=*/false));
}

at::Tensor SkBottleneckImpl::forward(at::Tensor x) {
  const at::Tensor shortcut = projection_.is_empty() ? x : projection_.forward(x);
  return at::relu(shortcut + net_->forward(x));
}

std::vector<int64_t> resnet_sk_stage_sizes(const ResNetSkOptions& options) {
  if (options.width_multiplier < 1) {
    throw OptionError(
        "ResNetSkOptions::width_multiplier",
        std::to_string(options.width_multiplier),
        "an integer >= 1");
  }
  if (!(options.sk_ratio >= 0)) {
    throw OptionError(
        "ResNetSkOptions::sk_ratio",
        fmt::format("{}", options.sk_ratio),
        "a ratio >= 0 (0: no selective kernels)");
  }
  if (!options.blocks_per_stage.empty()) {
    const auto& sizes = options.blocks_per_stage;
    if (sizes.size() != 4 ||
        !std::all_of(sizes.begin(), sizes.end(), [](int64_t n) { return n >= 1; })) {
      throw OptionError(
          "ResNetSkOptions::blocks_per_stage",
          fmt::format("[{}]", fmt::join(sizes, ", ")),
          "four block counts >= 1, or empty for the depth's");
    }
    return sizes;
  }
  if (options.depth != 152) {
    throw OptionError(
        "ResNetSkOptions::depth",
        std::to_string(options.depth),
        "152 (the only depth VISSL's resnet_sk builds)");
  }
  return {3, 8, 36, 3};
}

Trunk build_resnet_sk_trunk(const ResNetSkOptions& options, int64_t in_channels) {
  const std::vector<int64_t> stages = resnet_sk_stage_sizes(options);
  const int64_t w = options.width_multiplier;
  torch::nn::Sequential blocks;
  blocks->push_back(sk_stem(in_channels, w, options.sk_ratio));
  int64_t channels_in = 64 * w;
  for (size_t stage = 0; stage < stages.size(); ++stage) {
    const int64_t channels = (int64_t{64} << stage) * w;
    const int64_t stride = stage == 0 ? 1 : 2;
    for (int64_t i = 0; i < stages[stage]; ++i) {
      blocks->push_back(SkBottleneck(
          channels_in, channels, i == 0 ? stride : 1, options.sk_ratio, /*projection=*/i == 0));
      channels_in = channels * 4;
    }
  }
  blocks->push_back(SkSpatialMean());
  return Trunk{blocks, channels_in};
}

std::string resnet_sk_name_from_vissl(const std::string& name, const ResNetSkOptions& options) {
  const bool with_trunk = name.rfind("trunk.net.", 0) == 0;
  if (!with_trunk && name.rfind("net.", 0) != 0) {
    return name;
  }
  const std::string vissl = name.substr(with_trunk ? 10 : 4); // after "net."
  if (vissl.rfind("0.", 0) == 0) {
    return "trunk.0." + vissl.substr(2); // the stem
  }
  int stage = 0;
  long long index = 0;
  int consumed = 0;
  if (std::sscanf(vissl.c_str(), "%d.blocks.%lld.%n", &stage, &index, &consumed) != 2 ||
      consumed == 0 || stage < 1 || stage > 4) {
    return name;
  }
  const std::vector<int64_t> sizes = resnet_sk_stage_sizes(options);
  if (index < 0 || index >= sizes[static_cast<size_t>(stage - 1)]) {
    return name;
  }
  int64_t block = 1 + index;
  for (int s = 0; s + 1 < stage; ++s) {
    block += sizes[static_cast<size_t>(s)];
  }
  return fmt::format("trunk.{}.{}", block, vissl.substr(static_cast<size_t>(consumed)));
}

} // namespace largo::models
