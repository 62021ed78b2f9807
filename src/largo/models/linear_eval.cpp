#include <largo/models/linear_eval.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/batchnorm.h>

#include <algorithm>

namespace largo::models {
namespace {

const std::vector<std::string> kPools{
    "AvgPool2d", "MaxPool2d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "Identity"};

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

void validate_tap(const FeatureTap& tap, size_t index) {
  const std::string key = fmt::format("FeatureEvalOptions::taps[{}]", index);
  if (!contains(kPools, tap.pool)) {
    throw OptionError(key, tap.pool, fmt::format("a pool op: {}", fmt::join(kPools, ", ")));
  }
  const bool needs_size = tap.pool != "Identity";
  const bool size_ok = tap.kernel_size.size() == 1 || tap.kernel_size.size() == 2;
  if (needs_size &&
      (!size_ok || std::any_of(tap.kernel_size.begin(), tap.kernel_size.end(), [](int64_t v) {
        return v <= 0;
      }))) {
    throw OptionError(
        key,
        fmt::format("{} [{}]", tap.pool, fmt::join(tap.kernel_size, ", ")),
        "a kernel (or output) size of one or two integers > 0, e.g. "
        "[\"AvgPool2d\", [[8, 8], 3, 0]]");
  }
  if (tap.stride < 0 || tap.padding < 0) {
    throw OptionError(
        key,
        fmt::format("stride {}, padding {}", tap.stride, tap.padding),
        "a stride >= 0 (0: the kernel size) and a padding >= 0");
  }
}

void validate_head(const EvalHeadOptions& head, size_t index) {
  const std::string key = fmt::format("FeatureEvalOptions::heads[{}]", index);
  if (head.name != "eval_mlp" && head.name != "mlp") {
    throw OptionError(key, head.name, "eval_mlp or mlp (one head per feature tap)");
  }
  if (head.name == "eval_mlp" && head.in_channels <= 0) {
    throw OptionError(key + ".in_channels", std::to_string(head.in_channels), "an integer > 0");
  }
  if (head.dims.size() < 2) {
    throw OptionError(
        key + ".dims",
        fmt::format("[{}]", fmt::join(head.dims, ", ")),
        "at least two dims [in, ..., classes]");
  }
}

} // namespace

std::vector<std::string> tap_features(const FeatureEvalOptions& options) {
  std::vector<std::string> features;
  for (const FeatureTap& tap : options.taps) {
    features.push_back(tap.feature);
  }
  return features;
}

void validate_feature_eval_options(const FeatureEvalOptions& options) {
  for (size_t i = 0; i < options.taps.size(); ++i) {
    validate_tap(options.taps[i], i);
  }
  // VISSL's trunk feature extraction taps the trunk without heads (its configs leave
  // MODEL.HEAD.PARAMS empty there).
  const bool trunk_features_only = options.extract_trunk_features_only && options.heads.empty();
  if (!options.taps.empty() && options.heads.size() != options.taps.size() &&
      !trunk_features_only) {
    throw OptionError(
        "FeatureEvalOptions::heads",
        fmt::format("{} heads", options.heads.size()),
        fmt::format(
            "one head per entry of FeatureEvalOptions::taps ({}), or none with "
            "FeatureEvalOptions::extract_trunk_features_only",
            options.taps.size()));
  }
  if (options.taps.empty() && !options.heads.empty()) {
    throw OptionError(
        "FeatureEvalOptions::heads",
        fmt::format("{} eval heads", options.heads.size()),
        "one [\"mlp\", ...] head (the pretrained model's) when FeatureEvalOptions::taps is "
        "empty");
  }
  for (size_t i = 0; i < options.heads.size(); ++i) {
    validate_head(options.heads[i], i);
  }
}

EvalLinearHeadImpl::EvalLinearHeadImpl(const EvalHeadOptions& options) {
  clf_ = register_module("clf", build_mlp_head(options.dims, options.mlp));
}

at::Tensor EvalLinearHeadImpl::forward(at::Tensor x) {
  return clf_->forward(x.flatten(1)); // [b, c] or [b, c, 1, 1] -> [b, c]
}

EvalMlpHeadImpl::EvalMlpHeadImpl(const EvalHeadOptions& options) {
  channel_bn_ =
      torch::nn::AnyModule(torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(options.in_channels)
                                                      .eps(options.mlp.batchnorm_eps)
                                                      .momentum(options.mlp.batchnorm_momentum)));
  register_module("channel_bn", channel_bn_.ptr());
  clf_ = register_module("clf", EvalLinearHead(options));
}

at::Tensor EvalMlpHeadImpl::forward(at::Tensor x) {
  if (x.dim() == 2) {
    x = x.unsqueeze(2).unsqueeze(3); // VISSL: [b, c] is seen as [b, c, 1, 1]
  }
  return clf_->forward(channel_bn_.forward(x));
}

void EvalMlpHeadImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  if (name != "channel_bn" || replacement.any.is_empty()) {
    throw Error(fmt::format("EvalMlpHead cannot swap its child {}", name));
  }
  replace_module(name, replacement.any.ptr());
  channel_bn_ = replacement.any;
}

LinearEvalModelImpl::LinearEvalModelImpl(
    TrunkHeadModel pretrained, const FeatureEvalOptions& options)
    : options_(options) {
  validate_feature_eval_options(options_);
  if (!options_.enabled()) {
    throw OptionError(
        "FeatureEvalOptions::eval_mode_on",
        options_.eval_mode_on ? "True" : "False",
        "True, with FeatureEvalOptions::freeze_trunk_only or "
        "FeatureEvalOptions::freeze_trunk_and_head, to build "
        "a linear evaluation model");
  }
  trunk_ = register_module("trunk", pretrained->trunk());
  for (auto& parameter : trunk_->parameters()) {
    parameter.set_requires_grad(false);
  }
  if (options_.taps.empty()) {
    head_ = register_module("head", pretrained->head());
    if (options_.freeze_trunk_and_head) {
      for (auto& parameter : head_->parameters()) {
        parameter.set_requires_grad(false);
      }
    }
  } else {
    taps_ = TrunkTaps(trunk_, tap_features(options_)); // throws for features it lacks
    heads_ = register_module("heads", torch::nn::ModuleList());
    for (const auto& head : options_.heads) {
      if (head.name == "eval_mlp") {
        EvalMlpHead module(head);
        heads_->push_back(module);
        head_calls_.emplace_back(module);
      } else {
        EvalLinearHead module(head);
        heads_->push_back(module);
        head_calls_.emplace_back(module);
      }
      if (options_.freeze_trunk_and_head) {
        for (auto& parameter : heads_[heads_->size() - 1]->parameters()) {
          parameter.set_requires_grad(false);
        }
      }
    }
  }
  train(pretrained->is_training());
}

void LinearEvalModelImpl::train(bool on) {
  torch::nn::Module::train(on);
  trunk_->eval(); // frozen: BatchNorm uses (and keeps) the pretrained statistics
  if (options_.freeze_trunk_and_head) {
    if (head_) {
      head_->eval();
    }
    if (heads_) {
      heads_->eval();
    }
  }
}

int64_t LinearEvalModelImpl::num_outputs() const {
  return options_.taps.empty() ? 1 : static_cast<int64_t>(options_.heads.size());
}

at::Tensor LinearEvalModelImpl::pool(const FeatureTap& tap, at::Tensor x) const {
  if (tap.pool != "Identity" && x.dim() != 4) { // flatten, the ViT's: nothing to pool over
    throw OptionError(
        "FeatureEvalOptions::taps",
        fmt::format("[\"{}\", [\"{}\", ...]]", tap.feature, tap.pool),
        fmt::format(
            "Identity for feature {}: it is [{}], with no height and width to pool",
            tap.feature,
            fmt::join(x.sizes(), ", ")));
  }
  if (tap.pool != "Identity") {
    std::vector<int64_t> size = tap.kernel_size;
    if (size.size() == 1) {
      size.push_back(size[0]);
    }
    const std::vector<int64_t> stride =
        tap.stride > 0 ? std::vector<int64_t>{tap.stride, tap.stride} : size;
    const std::vector<int64_t> padding{tap.padding, tap.padding};
    if (tap.pool == "AvgPool2d") {
      x = at::avg_pool2d(x, size, stride, padding);
    } else if (tap.pool == "MaxPool2d") {
      x = at::max_pool2d(x, size, stride, padding);
    } else if (tap.pool == "AdaptiveAvgPool2d") {
      x = at::adaptive_avg_pool2d(x, size);
    } else {
      x = std::get<0>(at::adaptive_max_pool2d(x, size));
    }
  }
  return options_.should_flatten_feats ? x.flatten(1) : x;
}

std::vector<at::Tensor> LinearEvalModelImpl::forward_features(at::Tensor x) {
  torch::NoGradGuard frozen; // the trunk has no trainable parameters
  if (options_.taps.empty()) {
    for (auto& block : *trunk_) {
      x = block.forward<at::Tensor>(std::move(x));
    }
    return {x};
  }
  std::vector<at::Tensor> features = taps_.forward(trunk_, std::move(x));
  for (size_t i = 0; i < features.size(); ++i) {
    features[i] = pool(options_.taps[i], std::move(features[i]));
  }
  return features;
}

int64_t LinearEvalModelImpl::trunk_blocks_run() const {
  if (options_.taps.empty()) {
    return static_cast<int64_t>(trunk_->size());
  }
  return taps_.blocks_run();
}

at::Tensor LinearEvalModelImpl::forward(at::Tensor images) {
  std::vector<at::Tensor> outputs = forward_outputs(std::move(images));
  return outputs.size() == 1 ? outputs[0] : at::cat(outputs, 1);
}

std::vector<at::Tensor> LinearEvalModelImpl::split_outputs(const at::Tensor& concatenated) const {
  return models::split_outputs(concatenated, output_widths());
}

std::vector<int64_t> LinearEvalModelImpl::output_widths() const {
  std::vector<int64_t> widths;
  if (!options_.taps.empty()) {
    for (const auto& head : options_.heads) {
      widths.push_back(head.dims.back());
    }
  }
  return widths;
}

std::vector<at::Tensor> LinearEvalModelImpl::forward_outputs(at::Tensor images) {
  if (!options_.taps.empty() && options_.heads.empty()) {
    throw OptionError(
        "FeatureEvalOptions::heads",
        "none",
        "one head per tap to compute outputs (without heads, extract_trunk_features_only, the "
        "model gives its tapped features: forward_features)");
  }
  std::vector<at::Tensor> features = forward_features(std::move(images));
  if (options_.taps.empty()) {
    return {head_->forward(features[0])};
  }
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < features.size(); ++i) {
    const EvalHeadOptions& head = options_.heads[i];
    const at::Tensor& feature = features[i];
    const int64_t width = feature.numel() / std::max<int64_t>(feature.size(0), 1);
    const int64_t channels = feature.dim() == 4 ? feature.size(1) : width;
    const bool fits = width == head.dims.front() &&
                      (head.name != "eval_mlp" || channels == head.in_channels) &&
                      (head.name == "eval_mlp" || feature.dim() <= 2 ||
                       feature.numel() == feature.size(0) * feature.size(1));
    if (!fits) {
      throw OptionError(
          fmt::format("FeatureEvalOptions::heads[{}]", i),
          fmt::format(
              "{} in_channels {} dims [{}]",
              head.name,
              head.in_channels,
              fmt::join(head.dims, ", ")),
          fmt::format(
              "a head that fits feature {} pooled by {}: shape [{}] ({} values per image)",
              options_.taps[i].feature,
              options_.taps[i].pool,
              fmt::join(feature.sizes(), ", "),
              width));
    }
    outputs.push_back(head_calls_[i].forward(feature));
  }
  return outputs;
}

std::vector<at::Tensor>
split_outputs(const at::Tensor& concatenated, const std::vector<int64_t>& widths) {
  if (widths.empty()) {
    return {concatenated};
  }
  return concatenated.split_with_sizes(widths, 1);
}

void LinearEvalModelImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_sequential_member(*this, name, replacement, {{"trunk", &trunk_}, {"head", &head_}});
}

} // namespace largo::models
