#include <largo/models/small_cnn.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/batchnorm.h>

namespace largo::models {

SmallCnnStageImpl::SmallCnnStageImpl(const SmallCnnStageOptions& options) : options_(options) {
  // BN follows, so a conv bias would be redundant.
  conv_ = register_module(
      "conv",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(options.in_channels, options.out_channels, 3)
                            .padding(1)
                            .bias(false)));
  bn_ = torch::nn::AnyModule(torch::nn::BatchNorm2d(options.out_channels));
  register_module("bn", bn_.ptr());
}

void SmallCnnStageImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  if (name != "bn" || replacement.any.is_empty()) {
    throw Error(fmt::format("SmallCnnStage cannot swap its child {} for a {}", name,
                            replacement.module()->name()));
  }
  replace_module(name, replacement.any.ptr());
  bn_ = replacement.any;
}

at::Tensor SmallCnnStageImpl::forward(at::Tensor x) {
  at::Tensor weight = conv_->weight;
  if (options_.channels_last) {
    // Both operands: with a 1-channel input the layout is ambiguous from the input alone,
    // and oneDNN picks channels-last only when it sees it. The weight copy is tiny and is
    // made per call because parameters may be views into flat buffers (DDP, ZeRO).
    x = x.contiguous(at::MemoryFormat::ChannelsLast);
    weight = weight.contiguous(at::MemoryFormat::ChannelsLast);
  }
  x = at::conv2d(x, weight, /*bias=*/{}, /*stride=*/1, /*padding=*/1); // [b, out, h, w]
  x = at::max_pool2d(x, /*kernel_size=*/2);                            // [b, out, h/2, w/2]
  x = bn_.forward(x).relu_();
  if (options_.pooled_size > 0) {
    const int64_t pooled = options_.pooled_size;
    if (x.size(2) != pooled || x.size(3) != pooled) {
      x = at::adaptive_avg_pool2d(x, {pooled, pooled});
    }
    // flatten() follows the logical [b, c, h, w] order whatever the memory layout.
    x = x.flatten(1); // [b, out * pooled * pooled]
    if (options_.dropout > 0.0) {
      x = at::dropout(x, options_.dropout, is_training());
    }
  }
  return x;
}

Trunk build_small_cnn_trunk(
    const SmallCnnOptions& options, int64_t in_channels, int64_t image_size) {
  const bool channels_positive = std::all_of(
      options.channels.begin(), options.channels.end(), [](int64_t c) { return c > 0; });
  if (options.channels.empty() || !channels_positive) {
    throw OptionError(
        "SmallCnnOptions::channels",
        fmt::format("[{}]", fmt::join(options.channels, ", ")),
        "a non-empty list of channel counts > 0, one per conv stage");
  }
  if (options.pooled_size < 1) {
    throw OptionError(
        "SmallCnnOptions::pooled_size", std::to_string(options.pooled_size), "an integer >= 1");
  }
  if (!(options.dropout >= 0.0 && options.dropout < 1.0)) {
    throw OptionError(
        "SmallCnnOptions::dropout", fmt::format("{}", options.dropout), "a rate in [0, 1)");
  }
  if (in_channels <= 0) {
    throw ConfigError(fmt::format("small_cnn input channels must be > 0, got {}", in_channels));
  }
  const int64_t num_stages = static_cast<int64_t>(options.channels.size());
  if (num_stages >= 31 || image_size < (int64_t{1} << num_stages)) {
    throw ConfigError(fmt::format(
        "small_cnn with {} stages halves the image {} times, so it needs images of at least "
        "{} pixels per side; got {}. Use fewer SmallCnnOptions::channels entries or "
        "larger images.",
        num_stages,
        num_stages,
        int64_t{1} << std::min<int64_t>(num_stages, 30),
        image_size));
  }

  torch::nn::Sequential blocks;
  int64_t channels = in_channels;
  for (int64_t stage = 0; stage < num_stages; ++stage) {
    const bool last = stage + 1 == num_stages;
    SmallCnnStageOptions stage_options;
    stage_options.in_channels = channels;
    stage_options.out_channels = options.channels[stage];
    stage_options.channels_last = options.channels_last;
    stage_options.pooled_size = last ? options.pooled_size : 0;
    stage_options.dropout = last ? options.dropout : 0.0;
    blocks->push_back(SmallCnnStage(stage_options));
    channels = options.channels[stage];
  }
  return Trunk{blocks, channels * options.pooled_size * options.pooled_size};
}

} // namespace largo::models
