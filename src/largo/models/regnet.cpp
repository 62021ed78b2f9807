#include <largo/models/regnet.h>

#include <largo/models/resnet.h>

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/models/norm_relu.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <utility>

namespace largo::models {
namespace {

const std::string kRegNetOptions = "RegNetOptions::";

struct RegNetPreset {
  const char* name;
  int64_t depth;
  int64_t w_0;
  double w_a;
  double w_m;
  int64_t group_width;
  bool use_se;
};

// ClassyVision's registered RegNets (classy_vision/models/regnet.py); 64gf, 128gf and 256gf
// are the SEER sizes of VISSL's configs.
constexpr RegNetPreset kRegNetPresets[] = {
    {"regnet_y_400mf", 16, 48, 27.89, 2.09, 8, true},
    {"regnet_y_800mf", 14, 56, 38.84, 2.4, 16, true},
    {"regnet_y_1.6gf", 27, 48, 20.71, 2.65, 24, true},
    {"regnet_y_3.2gf", 21, 80, 42.63, 2.66, 24, true},
    {"regnet_y_8gf", 17, 192, 76.82, 2.19, 56, true},
    {"regnet_y_16gf", 18, 200, 106.23, 2.48, 112, true},
    {"regnet_y_32gf", 20, 232, 115.89, 2.53, 232, true},
    {"regnet_y_64gf", 20, 352, 147.48, 2.4, 328, true},
    {"regnet_y_128gf", 27, 456, 160.83, 2.52, 264, true},
    {"regnet_y_256gf", 27, 640, 124.47, 2.04, 848, true},
    {"regnet_x_400mf", 22, 24, 24.48, 2.54, 16, false},
    {"regnet_x_800mf", 16, 56, 35.73, 2.28, 16, false},
    {"regnet_x_1.6gf", 18, 80, 34.01, 2.25, 24, false},
    {"regnet_x_3.2gf", 25, 88, 26.31, 2.25, 48, false},
    {"regnet_x_8gf", 23, 80, 49.56, 2.88, 120, false},
    {"regnet_x_16gf", 22, 216, 55.59, 2.1, 128, false},
    {"regnet_x_32gf", 23, 320, 69.86, 2.0, 168, false},
};

// Python's round() and numpy's round: to the nearest integer, halves to even (the default
// floating-point rounding mode).
double round_half_even(double value) {
  return std::nearbyint(value);
}

std::string number_text(double value) {
  return fmt::format("{}", value);
}

at::Tensor activate(at::Tensor x, const std::string& activation) {
  if (activation == "relu") {
    return x.relu_();
  }
  if (activation == "silu") {
    return torch::silu(x);
  }
  return x;
}

torch::nn::Conv2d
regnet_conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride)
                               .padding(kernel / 2)
                               .groups(groups)
                               .bias(false));
}

torch::nn::AnyModule regnet_batch_norm(int64_t channels, const RegNetOptions& options) {
  return torch::nn::AnyModule(torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(channels)
                                                         .eps(options.bn_epsilon)
                                                         .momentum(options.bn_momentum)));
}

// ClassyVision's (and torchvision's) RegNet init: convs normal(0, sqrt(2 / fan_out)) with
// fan_out = k * k * out_channels (groups not divided out), BN weight 1, bias 0. SE biases
// keep their default init, as there.
void init_like_classy_vision(torch::nn::Module& trunk) {
  torch::NoGradGuard no_grad;
  for (auto& module : trunk.modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      // weight: [out_channels, in_channels / groups, k, k]
      const double fan_out =
          static_cast<double>(conv->weight.size(0) * conv->weight.size(2) * conv->weight.size(3));
      conv->weight.normal_(0.0, std::sqrt(2.0 / fan_out));
    } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
      torch::nn::init::ones_(bn->weight);
      torch::nn::init::zeros_(bn->bias);
    }
  }
}

void require_regnet(
    bool ok, const std::string& field, const std::string& value, const std::string& expected) {
  require_option(ok, kRegNetOptions + field, value, expected);
}

// ClassyVision's per-block widths: the ramp w_0 + w_a * j, quantized in log space with base
// w_m, rounded to multiples of 8.
std::vector<int64_t> regnet_block_widths(const RegNetOptions& options) {
  constexpr double kQuantum = 8;
  std::vector<int64_t> widths;
  const double w_0 = static_cast<double>(options.w_0);
  for (int64_t j = 0; j < options.depth; ++j) {
    const double continuous = static_cast<double>(j) * options.w_a + w_0;
    const double capacity = round_half_even(std::log(continuous / w_0) / std::log(options.w_m));
    widths.push_back(static_cast<int64_t>(
        round_half_even(w_0 * std::pow(options.w_m, capacity) / kQuantum) * kQuantum));
  }
  return widths;
}

bool strip_prefix(const std::string& text, const std::string& prefix, std::string& rest) {
  if (text.compare(0, prefix.size(), prefix) != 0) {
    return false;
  }
  rest = text.substr(prefix.size());
  return true;
}

// ClassyVision's names inside a block (VISSL's regnet trunk) -> torchvision's.
std::string regnet_block_name_from_classy_vision(const std::string& name) {
  static const std::pair<const char*, const char*> renames[] = {
      {"f.se.excitation.0.", "f.se.fc1."},
      {"f.se.excitation.2.", "f.se.fc2."},
      {"f.final_bn.", "f.c.1."},
      {"f.c.", "f.c.0."},
      {"proj.", "proj.0."},
      {"bn.", "proj.1."},
  };
  std::string rest;
  for (const auto& [classy, torchvision] : renames) {
    if (strip_prefix(name, classy, rest)) {
      return torchvision + rest;
    }
  }
  return name;
}

// "block<s>-<i>.<rest>" (1-based stage s, 0-based block i) -> "trunk.<k>.<rest>", or "" when
// `name` is not of that form or names no block of `stages`.
std::string regnet_trunk_block_name(
    const std::string& name, const std::vector<RegNetStageSpec>& stages, bool classy_vision) {
  int stage = 0;
  long long index = 0;
  size_t consumed = 0;
  if (std::sscanf(name.c_str(), "block%d-%lld.%zn", &stage, &index, &consumed) != 2 ||
      consumed == 0 || stage < 1 || static_cast<size_t>(stage) > stages.size() || index < 0 ||
      index >= stages[static_cast<size_t>(stage - 1)].depth) {
    return "";
  }
  int64_t block = 1 + index;
  for (int s = 0; s + 1 < stage; ++s) {
    block += stages[static_cast<size_t>(s)].depth;
  }
  const std::string rest = name.substr(consumed);
  return fmt::format(
      "trunk.{}.{}", block, classy_vision ? regnet_block_name_from_classy_vision(rest) : rest);
}

} // namespace

std::string regnet_name_from_torchvision(const std::string& name, const RegNetOptions& options) {
  const std::vector<RegNetStageSpec> stages = regnet_stages(options);
  std::string rest;
  if (strip_prefix(name, "stem.", rest)) {
    return "trunk.0." + rest;
  }
  if (strip_prefix(name, "fc.", rest)) {
    return "head.0." + rest;
  }
  if (strip_prefix(name, "trunk_output.block", rest)) {
    // "trunk_output.block<s>.block<s>-<i>.<rest>": skip the stage's own name.
    const size_t dot = rest.find('.');
    const std::string mapped = dot == std::string::npos
                                   ? ""
                                   : regnet_trunk_block_name(rest.substr(dot + 1), stages, false);
    return mapped.empty() ? name : mapped;
  }
  // VISSL: "trunk._feature_blocks.conv1.stem.<rest>", "trunk._feature_blocks.res<r>.block...".
  std::string feature;
  if (!strip_prefix(name, "trunk._feature_blocks.", feature) &&
      !strip_prefix(name, "trunk.base_model._feature_blocks.", feature) &&
      !strip_prefix(name, "_feature_blocks.", feature)) {
    return name;
  }
  if (strip_prefix(feature, "conv1.stem.", rest)) {
    return "trunk.0." + rest;
  }
  if (strip_prefix(feature, "res", rest)) {
    const size_t dot = rest.find('.');
    const std::string mapped =
        dot == std::string::npos ? "" : regnet_trunk_block_name(rest.substr(dot + 1), stages, true);
    return mapped.empty() ? name : mapped;
  }
  return name;
}

std::vector<std::string> regnet_preset_names() {
  std::vector<std::string> names;
  for (const RegNetPreset& preset : kRegNetPresets) {
    names.emplace_back(preset.name);
  }
  return names;
}

RegNetOptions regnet_preset(const std::string& name) {
  // torchvision spells regnet_y_1.6gf as regnet_y_1_6gf.
  std::string classy_name = name;
  if (classy_name.size() > 9 && classy_name.compare(0, 7, "regnet_") == 0) {
    const size_t dot = classy_name.find('_', 9);
    if (dot != std::string::npos && dot + 1 < classy_name.size() &&
        std::isdigit(static_cast<unsigned char>(classy_name[dot + 1]))) {
      classy_name[dot] = '.';
    }
  }
  for (const RegNetPreset& preset : kRegNetPresets) {
    if (classy_name == preset.name) {
      RegNetOptions options;
      options.depth = preset.depth;
      options.w_0 = preset.w_0;
      options.w_a = preset.w_a;
      options.w_m = preset.w_m;
      options.group_width = preset.group_width;
      options.use_se = preset.use_se;
      return options;
    }
  }
  throw OptionError(
      kRegNetOptions + "name",
      name,
      fmt::format(
          "one of {} (or leave name out and set depth, w_0, w_a, w_m and group_width)",
          fmt::join(regnet_preset_names(), ", ")));
}

namespace {

// The ramp's parameters (ClassyVision's RegNetParams).
void validate_regnet_ramp(const RegNetOptions& o) {
  if (o.depth == 0 && o.w_0 == 0 && o.group_width == 0) {
    throw ConfigError(
        "no RegNet is set: give a preset (RegNetOptions::name: regnet_y_400mf, ...), the "
        "parameters RegNetOptions::depth, w_0, w_a, w_m and group_width, or the stages "
        "(RegNetOptions::stages)");
  }
  require_regnet(o.depth > 0, "depth", std::to_string(o.depth), "an integer > 0");
  require_regnet(o.w_0 > 0 && o.w_0 % 8 == 0, "w_0", std::to_string(o.w_0), "a multiple of 8, > 0");
  require_regnet(o.w_a >= 0, "w_a", number_text(o.w_a), "a number >= 0");
  require_regnet(o.w_m > 1, "w_m", number_text(o.w_m), "a number > 1");
  require_regnet(o.group_width > 0, "group_width", std::to_string(o.group_width), "an integer > 0");
  require_regnet(
      o.bottleneck_multiplier > 0,
      "bottleneck_multiplier",
      number_text(o.bottleneck_multiplier),
      "a number > 0");
}

// AnyNet's stages (ClassyVision's AnyNetParams): each its own parameters, none of the ramp's.
void validate_anynet_stages(const RegNetOptions& o) {
  const bool ramp_unset = o.depth == 0 && o.w_0 == 0 && o.w_a == 0 && o.w_m == 0 &&
                          o.group_width == 0 && o.bottleneck_multiplier == 1.0;
  require_regnet(
      ramp_unset,
      "stages",
      fmt::format("{} stages", o.stages.size()),
      "stages alone: they replace depth, w_0, w_a, w_m, group_width and "
      "bottleneck_multiplier, so leave those unset");
  for (size_t i = 0; i < o.stages.size(); ++i) {
    const RegNetStageSpec& stage = o.stages[i];
    const std::string field = fmt::format("stages[{}].", i);
    require_regnet(stage.width > 0, field + "width", std::to_string(stage.width), "> 0");
    require_regnet(stage.depth > 0, field + "depth", std::to_string(stage.depth), "> 0");
    require_regnet(stage.stride > 0, field + "stride", std::to_string(stage.stride), "> 0");
    require_regnet(
        stage.group_width > 0, field + "group_width", std::to_string(stage.group_width), "> 0");
    require_regnet(
        stage.bottleneck_multiplier > 0,
        field + "bottleneck_multiplier",
        number_text(stage.bottleneck_multiplier),
        "> 0");
  }
}

} // namespace

void validate_regnet_options(const RegNetOptions& o) {
  if (o.stages.empty()) {
    validate_regnet_ramp(o);
  } else {
    validate_anynet_stages(o);
  }
  require_regnet(
      o.stem_type == "simple_stem_in" || o.stem_type == "res_stem_in" ||
          o.stem_type == "res_stem_cifar",
      "stem_type",
      o.stem_type,
      "simple_stem_in, res_stem_in or res_stem_cifar");
  require_regnet(o.stem_width > 0, "stem_width", std::to_string(o.stem_width), "an integer > 0");
  require_regnet(
      o.block_type == "res_bottleneck_block",
      "block_type",
      o.block_type,
      "res_bottleneck_block (ClassyVision's vanilla_block, res_basic_block and "
      "res_bottleneck_linear_block are not built)");
  require_regnet(
      o.activation == "relu" || o.activation == "silu", "activation", o.activation, "relu or silu");
  require_regnet(
      o.se_ratio >= 0 && std::isfinite(o.se_ratio),
      "se_ratio",
      number_text(o.se_ratio),
      "a number >= 0 (0 or use_se: False for no squeeze-excitation)");
  require_regnet(o.bn_epsilon > 0, "bn_epsilon", number_text(o.bn_epsilon), "a number > 0");
  require_regnet(
      o.bn_momentum >= 0 && o.bn_momentum <= 1,
      "bn_momentum",
      number_text(o.bn_momentum),
      "a number in [0, 1]");
}

std::vector<RegNetStageSpec> regnet_stages(const RegNetOptions& options) {
  validate_regnet_options(options);
  if (!options.stages.empty()) {
    return options.stages; // AnyNet: as given
  }
  // A stage is a run of equal block widths.
  std::vector<RegNetStageSpec> stages;
  for (int64_t width : regnet_block_widths(options)) {
    if (stages.empty() || stages.back().width != width) {
      stages.push_back({width, 0, 2, options.group_width, options.bottleneck_multiplier});
    }
    ++stages.back().depth;
  }
  // ClassyVision's _adjust_widths_groups_compatibilty: the group width is at most the
  // bottleneck width, which is rounded to a multiple of it; the stage width follows.
  for (RegNetStageSpec& stage : stages) {
    const double multiplier = stage.bottleneck_multiplier;
    const auto bottleneck = static_cast<int64_t>(static_cast<double>(stage.width) * multiplier);
    stage.group_width = std::min(stage.group_width, bottleneck);
    require_regnet(
        stage.group_width > 0,
        "bottleneck_multiplier",
        number_text(multiplier),
        fmt::format(
            "a multiplier that leaves the width-{} stage a bottleneck of >= 1", stage.width));
    const double group = static_cast<double>(stage.group_width);
    const auto rounded =
        static_cast<int64_t>(round_half_even(static_cast<double>(bottleneck) / group) * group);
    stage.width = static_cast<int64_t>(static_cast<double>(rounded) / multiplier);
  }
  return stages;
}

std::vector<RegNetBlockSpec> regnet_blocks(const RegNetOptions& options) {
  std::vector<RegNetBlockSpec> blocks;
  int64_t channels = options.stem_width;
  const std::vector<RegNetStageSpec> stages = regnet_stages(options);
  for (size_t s = 0; s < stages.size(); ++s) {
    const RegNetStageSpec& stage = stages[s];
    for (int64_t i = 0; i < stage.depth; ++i) {
      RegNetBlockSpec block;
      block.in_channels = channels;
      block.out_channels = stage.width;
      block.stride = i == 0 ? stage.stride : 1;
      block.starts_stage = i == 0;
      block.bottleneck_width = static_cast<int64_t>(
          round_half_even(static_cast<double>(stage.width) * stage.bottleneck_multiplier));
      block.groups = block.bottleneck_width / stage.group_width;
      require_regnet(
          block.groups > 0 && block.bottleneck_width % block.groups == 0,
          options.stages.empty() ? "group_width" : fmt::format("stages[{}].group_width", s),
          std::to_string(options.stages.empty() ? options.group_width : stage.group_width),
          fmt::format(
              "a group width that splits the bottleneck width {} (stage width {} times "
              "bottleneck_multiplier {}) into equal groups",
              block.bottleneck_width,
              stage.width,
              stage.bottleneck_multiplier));
      if (options.use_se && options.se_ratio > 0) {
        block.se_width = static_cast<int64_t>(
            round_half_even(options.se_ratio * static_cast<double>(block.in_channels)));
        require_regnet(
            block.se_width > 0,
            "se_ratio",
            number_text(options.se_ratio),
            fmt::format(
                "a ratio that gives the width-{} block's squeeze-excitation >= 1 channel",
                block.in_channels));
      }
      blocks.push_back(block);
      channels = stage.width;
    }
  }
  return blocks;
}

ConvNormActivationImpl::ConvNormActivationImpl(
    int64_t in_channels,
    int64_t out_channels,
    int64_t kernel,
    int64_t stride,
    int64_t groups,
    const RegNetOptions& options,
    std::string activation)
    : activation_(std::move(activation)), fuse_relu_(options.fuse_relu && activation_ == "relu") {
  conv_ = register_module("0", regnet_conv(in_channels, out_channels, kernel, stride, groups));
  norm_ = regnet_batch_norm(out_channels, options);
  register_module("1", norm_.ptr());
}

at::Tensor ConvNormActivationImpl::forward(at::Tensor x) {
  if (fuse_relu_) {
    return norm_relu(norm_, conv_(x), /*fused=*/true);
  }
  return activate(norm_.forward(conv_(x)), activation_);
}

at::Tensor
ConvNormActivationImpl::forward_add_relu(const at::Tensor& x, const at::Tensor& residual) {
  return norm_add_relu(norm_, conv_(x), residual, /*fused=*/true);
}

// The "1" child (of the stem too) is the norm layer: the only one to swap.
void ConvNormActivationImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  if (name != "1" || replacement.any.is_empty()) {
    throw Error(fmt::format(
        "{} cannot swap its child {} for a {}", this->name(), name, replacement.module()->name()));
  }
  replace_module(name, replacement.any.ptr());
  norm_ = replacement.any;
}

RegNetStemImpl::RegNetStemImpl(int64_t in_channels, const RegNetOptions& options)
    : ConvNormActivationImpl(
          in_channels,
          options.stem_width,
          /*kernel=*/options.stem_type == "res_stem_in" ? 7 : 3,
          /*stride=*/options.stem_type == "res_stem_cifar" ? 1 : 2,
          /*groups=*/1,
          options,
          options.activation),
      max_pool_(options.stem_type == "res_stem_in") {}

at::Tensor RegNetStemImpl::forward(at::Tensor x) {
  x = ConvNormActivationImpl::forward(std::move(x));
  if (max_pool_) {
    x = torch::max_pool2d(x, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
  }
  return x;
}

SqueezeExcitationImpl::SqueezeExcitationImpl(
    int64_t channels, int64_t squeeze_channels, std::string activation)
    : activation_(std::move(activation)) {
  fc1_ = register_module(
      "fc1", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, squeeze_channels, 1)));
  fc2_ = register_module(
      "fc2", torch::nn::Conv2d(torch::nn::Conv2dOptions(squeeze_channels, channels, 1)));
}

at::Tensor SqueezeExcitationImpl::forward(at::Tensor x) {
  at::Tensor scale = torch::adaptive_avg_pool2d(x, {1, 1}); // [b, c, 1, 1]
  scale = fc2_(activate(fc1_(scale), activation_)).sigmoid();
  return x * scale;
}

BottleneckTransformImpl::BottleneckTransformImpl(
    const RegNetBlockSpec& spec, const RegNetOptions& options) {
  const int64_t width = spec.bottleneck_width;
  const std::string& act = options.activation;
  a_ = register_module("a", ConvNormActivation(spec.in_channels, width, 1, 1, 1, options, act));
  b_ = register_module(
      "b", ConvNormActivation(width, width, 3, spec.stride, spec.groups, options, act));
  if (spec.se_width > 0) {
    se_ = register_module("se", SqueezeExcitation(width, spec.se_width, act));
  }
  c_ = register_module("c", ConvNormActivation(width, spec.out_channels, 1, 1, 1, options, ""));
}

at::Tensor BottleneckTransformImpl::forward(at::Tensor x) {
  x = b_(a_(std::move(x)));
  if (se_) {
    x = se_(x);
  }
  return c_(x);
}

at::Tensor BottleneckTransformImpl::forward_add_relu(at::Tensor x, const at::Tensor& shortcut) {
  x = b_(a_(std::move(x)));
  if (se_) {
    x = se_(x);
  }
  return c_->forward_add_relu(x, shortcut);
}

RegNetBlockImpl::RegNetBlockImpl(const RegNetBlockSpec& spec, const RegNetOptions& options)
    : starts_stage_(spec.starts_stage),
      activation_(options.activation),
      fuse_add_relu_(options.fuse_relu && options.activation == "relu") {
  if (spec.projection()) {
    proj_ = register_module(
        "proj",
        ConvNormActivation(spec.in_channels, spec.out_channels, 1, spec.stride, 1, options, ""));
  }
  f_ = register_module("f", BottleneckTransform(spec, options));
}

at::Tensor RegNetBlockImpl::forward(at::Tensor x) {
  at::Tensor shortcut = proj_ ? proj_(x) : x;
  if (fuse_add_relu_) {
    return f_->forward_add_relu(x, shortcut);
  }
  at::Tensor out = f_(x);
  out += shortcut;
  return activate(out, activation_);
}

Trunk build_regnet_trunk(const RegNetOptions& options, int64_t in_channels) {
  if (in_channels <= 0) {
    throw ConfigError(fmt::format("RegNet input channels must be > 0, got {}", in_channels));
  }
  const std::vector<RegNetBlockSpec> specs = regnet_blocks(options); // validates
  torch::nn::Sequential blocks;
  blocks->push_back(RegNetStem(in_channels, options));
  for (const RegNetBlockSpec& spec : specs) {
    blocks->push_back(RegNetBlock(spec, options));
  }
  blocks->push_back(GlobalAvgPool());
  init_like_classy_vision(*blocks);
  return Trunk{blocks, specs.back().out_channels};
}

} // namespace largo::models
