#include <largo/models/feature_taps.h>

#include <largo/core/error.h>
#include <largo/models/regnet.h>
#include <largo/models/resnet.h>
#include <largo/models/vit.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

namespace largo::models {
namespace {

const std::vector<std::string> kResNetTaps{
    "conv1", "res1", "res2", "res3", "res4", "res5", "res5avg", "flatten"};

// What each trunk offers, for messages (stage and layer counts of the built trunk are added
// by TrunkTaps).
std::string tap_names_text(const std::string& trunk_name) {
  if (trunk_name == "resnet") {
    return fmt::format("a resnet feature: {}", fmt::join(kResNetTaps, ", "));
  }
  if (trunk_name == "regnet") {
    return "a regnet feature: conv1 (the stem), res2 .. res<S+1> (after each of the S stages; "
           "res5 the last of four), avgpool, flatten";
  }
  return "a vision_transformer feature: lastCLS, blkCLS<i> (layer i, from 0), concatCLS<n> "
         "(the last n layers) with a class token (VitOptions::use_class_token true and "
         "VitOptions::classifier token); lastPOOL, concatPOOL<n>, stridePOOL_<count>[_<stride>] "
         "without one (VitOptions::use_class_token false or VitOptions::classifier gap); "
         "lastBLK, concatBLK<n> (every token) with or without";
}

// "res12" with prefix "res" -> 12; -1 when `name` is not the prefix and a plain number.
int64_t numbered(const std::string& name, const std::string& prefix) {
  const std::string digits = name.substr(std::min(prefix.size(), name.size()));
  const bool ok = name.rfind(prefix, 0) == 0 && !digits.empty() && digits.size() <= 6 &&
                  std::all_of(digits.begin(), digits.end(), [](unsigned char c) {
                    return std::isdigit(c) != 0;
                  });
  return ok ? std::stoll(digits) : -1;
}

bool is_regnet_tap(const std::string& name) {
  return name == "conv1" || name == "avgpool" || name == "flatten" || numbered(name, "res") >= 2;
}

// VISSL's stridePOOL_<count>_<stride> or stridePOOL_<count> -> {count, stride}, stride 0 when
// not given; {0, 0} when `name` is not one (count and a given stride must be >= 1: VISSL's
// divmod and slice fail on 0).
std::pair<int64_t, int64_t> stride_pool(const std::string& name) {
  const std::string prefix = "stridePOOL_";
  if (name.rfind(prefix, 0) != 0) {
    return {0, 0};
  }
  const std::string rest = name.substr(prefix.size());
  const size_t split = rest.find('_');
  const int64_t count = numbered(rest.substr(0, split), "");
  const int64_t stride = split == std::string::npos ? 0 : numbered(rest.substr(split + 1), "");
  const bool ok = count >= 1 && (split == std::string::npos || stride >= 1);
  return ok ? std::pair{count, stride} : std::pair<int64_t, int64_t>{0, 0};
}

// lastBLK and concatBLK<n>: every token of the layers, not a reduction of them.
bool is_block_feature(const std::string& name) {
  return name == "lastBLK" || name.rfind("concatBLK", 0) == 0;
}

bool is_vit_tap(const std::string& name) {
  return name == "lastCLS" || name == "lastPOOL" || name == "lastBLK" ||
         numbered(name, "blkCLS") >= 0 || numbered(name, "concatCLS") >= 1 ||
         numbered(name, "concatPOOL") >= 1 || numbered(name, "concatBLK") >= 1 ||
         stride_pool(name).first >= 1;
}

bool is_tap_of(const std::string& trunk_name, const std::string& name) {
  if (trunk_name == "resnet") {
    return std::find(kResNetTaps.begin(), kResNetTaps.end(), name) != kResNetTaps.end();
  }
  return trunk_name == "regnet" ? is_regnet_tap(name) : is_vit_tap(name);
}

std::string tap_key(size_t index) {
  return fmt::format("FeatureEvalOptions::taps[{}]", index);
}

// The trunk a Sequential is, by its first and last blocks ("" for one that cannot be tapped).
std::string tapped_trunk_name(const torch::nn::Sequential& trunk) {
  if (trunk->size() < 3) {
    return "";
  }
  const auto& first = trunk->ptr(0);
  const auto& last = trunk->ptr(trunk->size() - 1);
  if (last->as<GlobalAvgPoolImpl>() != nullptr) {
    if (first->as<ResNetStemImpl>() != nullptr) {
      return "resnet";
    }
    if (first->as<RegNetStemImpl>() != nullptr) {
      return "regnet";
    }
  }
  const bool vit =
      first->as<VitPatchEmbeddingImpl>() != nullptr && last->as<VitFinalNormImpl>() != nullptr;
  return vit ? "vision_transformer" : "";
}

// The blocks run at the end of each stage: after res1 (the stem), res2, ... for a ResNet
// (its stage sizes found from its depth), after res2, res3, ... for a RegNet (its blocks say
// which starts a stage).
std::vector<int64_t> stage_ends(const std::string& trunk_name, const torch::nn::Sequential& trunk) {
  const auto blocks = static_cast<int64_t>(trunk->size());
  std::vector<int64_t> ends;
  if (trunk_name == "regnet") {
    for (int64_t block = 2; block < blocks - 1; ++block) {
      if (trunk->ptr(block)->as<RegNetBlockImpl>()->starts_stage()) {
        ends.push_back(block); // the previous stage ended with block - 1
      }
    }
    ends.push_back(blocks - 1);
    return ends;
  }
  for (int64_t depth : {18, 34, 101, 152, 200}) { // 50 has 34's stages
    std::vector<int64_t> sizes = resnet_stage_sizes(depth);
    ends = {1};
    for (int64_t size : sizes) {
      ends.push_back(ends.back() + size);
    }
    if (ends.back() + 1 == blocks) {
      return ends;
    }
  }
  throw Error(fmt::format("a ResNet trunk of {} blocks has no known depth", blocks));
}

// The conv trunks' features, as VISSL's names list them in the trunk's order.
std::vector<std::string> conv_tap_names(const std::string& trunk_name, size_t stages) {
  if (trunk_name == "resnet") {
    return kResNetTaps;
  }
  std::vector<std::string> names{"conv1"};
  for (size_t stage = 0; stage < stages; ++stage) {
    names.push_back(fmt::format("res{}", stage + 2));
  }
  names.insert(names.end(), {"avgpool", "flatten"});
  return names;
}

// The blocks run before `feature` of a conv trunk (-1: ResNet's conv1, inside the stem).
int64_t blocks_before(
    const std::string& trunk_name,
    const std::string& feature,
    const std::vector<int64_t>& ends,
    int64_t blocks) {
  if (feature == "conv1") {
    return trunk_name == "resnet" ? -1 : 1;
  }
  if (feature == "res5avg" || feature == "avgpool" || feature == "flatten") {
    return blocks;
  }
  // ResNet's ends start at res1, RegNet's at res2.
  return ends[static_cast<size_t>(numbered(feature, "res") - (trunk_name == "resnet" ? 1 : 2))];
}

// stridePOOL's layers as VISSL's interms[::-stride][:count] picks them: the last, then every
// stride-th one before it, at most count (fewer when the layers run out, as VISSL's slice
// gives). Without a stride, ceil(layers / count).
std::vector<int64_t> strided_layers(int64_t count, int64_t stride, int64_t layers) {
  if (stride == 0) {
    stride = layers / count + (layers % count != 0 ? 1 : 0);
  }
  std::vector<int64_t> picked;
  for (int64_t layer = layers - 1; layer >= 0 && static_cast<int64_t>(picked.size()) < count;
       layer -= stride) {
    picked.push_back(layer);
  }
  return picked;
}

// ViT feature -> the layers (from 0) whose class tokens, token means or tokens it
// concatenates, in VISSL's order; empty when this trunk lacks it. The *CLS features need
// the class token, the *POOL ones its absence (VISSL asserts both); *BLK take either.
std::vector<int64_t> vit_layers_of(const std::string& feature, int64_t layers, bool class_token) {
  const bool cls =
      feature == "lastCLS" || feature.rfind("blkCLS", 0) == 0 || feature.rfind("concatCLS", 0) == 0;
  if (!is_block_feature(feature) && cls != class_token) {
    return {};
  }
  if (feature == "lastCLS" || feature == "lastPOOL" || feature == "lastBLK") {
    return {layers - 1};
  }
  if (const int64_t layer = numbered(feature, "blkCLS"); layer >= 0) {
    return layer < layers ? std::vector<int64_t>{layer} : std::vector<int64_t>{};
  }
  if (const auto [count, stride] = stride_pool(feature); count >= 1) {
    return strided_layers(count, stride, layers);
  }
  const int64_t count = std::max(
      {numbered(feature, "concatCLS"),
       numbered(feature, "concatPOOL"),
       numbered(feature, "concatBLK")});
  std::vector<int64_t> last;
  for (int64_t layer = layers - count; count >= 1 && count <= layers && layer < layers; ++layer) {
    last.push_back(layer);
  }
  return last;
}

std::string vit_tap_names_text(int64_t layers, bool class_token) {
  if (class_token) {
    return fmt::format(
        "a feature of this vision_transformer ({} layers, a class token): lastCLS, blkCLS0 .. "
        "blkCLS{}, concatCLS1 .. concatCLS{}, lastBLK, concatBLK1 .. concatBLK{} (lastPOOL, "
        "concatPOOL<n> and stridePOOL_<count>[_<stride>] need no class token: "
        "VitOptions::use_class_token false or VitOptions::classifier gap)",
        layers,
        layers - 1,
        layers,
        layers);
  }
  return fmt::format(
      "a feature of this vision_transformer ({} layers, no class token): lastPOOL, concatPOOL1 .. "
      "concatPOOL{}, stridePOOL_<count>[_<stride>], lastBLK, concatBLK1 .. concatBLK{} (the "
      "*CLS features need VitOptions::use_class_token true and VitOptions::classifier token)",
      layers,
      layers,
      layers);
}

} // namespace

const std::vector<std::string>& tappable_trunk_names() {
  static const std::vector<std::string> names{"resnet", "regnet", "vision_transformer"};
  return names;
}

void validate_tap_features(
    const std::vector<std::string>& features, const std::string& trunk_name) {
  const auto& trunks = tappable_trunk_names();
  if (!features.empty() && std::find(trunks.begin(), trunks.end(), trunk_name) == trunks.end()) {
    throw OptionError(
        "ModelOptions::trunk_name",
        trunk_name,
        fmt::format(
            "a trunk whose features FeatureEvalOptions::taps can name: {} (or no taps, to train "
            "the model's own head on its output)",
            fmt::join(trunks, ", ")));
  }
  for (size_t i = 0; i < features.size(); ++i) {
    if (!is_tap_of(trunk_name, features[i])) {
      throw OptionError(tap_key(i), features[i], tap_names_text(trunk_name));
    }
  }
}

TrunkTaps::TrunkTaps(const torch::nn::Sequential& trunk, std::vector<std::string> features)
    : trunk_name_(tapped_trunk_name(trunk)), features_(std::move(features)) {
  if (trunk_name_.empty()) {
    throw OptionError(
        "FeatureEvalOptions::taps",
        "(features of the trunk)",
        fmt::format(
            "a trunk whose features can be tapped ({}); leave the map empty to evaluate "
            "another trunk's output",
            fmt::join(tappable_trunk_names(), ", ")));
  }
  validate_tap_features(features_, trunk_name_);
  const auto blocks = static_cast<int64_t>(trunk->size());
  if (trunk_name_ == "vision_transformer") {
    const int64_t layers = blocks - 2;
    const bool class_token = trunk->ptr(0)->as<VitPatchEmbeddingImpl>()->has_class_token();
    for (size_t i = 0; i < features_.size(); ++i) {
      layers_.push_back(vit_layers_of(features_[i], layers, class_token));
      if (layers_.back().empty()) {
        throw OptionError(tap_key(i), features_[i], vit_tap_names_text(layers, class_token));
      }
      const int64_t deepest = *std::max_element(layers_.back().begin(), layers_.back().end());
      blocks_run_ = std::max(blocks_run_, deepest + 2); // embedding + layers
    }
    return;
  }
  const std::vector<int64_t> ends = stage_ends(trunk_name_, trunk);
  const std::vector<std::string> names = conv_tap_names(trunk_name_, ends.size());
  for (size_t i = 0; i < features_.size(); ++i) {
    if (std::find(names.begin(), names.end(), features_[i]) == names.end()) {
      throw OptionError(
          tap_key(i),
          features_[i],
          fmt::format("a feature of this {}: {}", trunk_name_, fmt::join(names, ", ")));
    }
    after_blocks_.push_back(blocks_before(trunk_name_, features_[i], ends, blocks));
    blocks_run_ = std::max(blocks_run_, std::max<int64_t>(1, after_blocks_.back()));
  }
}

std::vector<at::Tensor>
TrunkTaps::forward(const torch::nn::Sequential& trunk, at::Tensor images) const {
  return trunk_name_ == "vision_transformer" ? forward_vit(trunk, std::move(images))
                                             : forward_conv(trunk, std::move(images));
}

std::vector<at::Tensor>
TrunkTaps::forward_conv(const torch::nn::Sequential& frozen, at::Tensor x) const {
  torch::nn::Sequential trunk = frozen; // the same modules; AnyModule::forward is not const
  std::vector<at::Tensor> features(features_.size());
  auto record = [&](int64_t after_block, const at::Tensor& value) {
    for (size_t i = 0; i < features_.size(); ++i) {
      if (after_blocks_[i] != after_block) {
        continue;
      }
      const bool pooled = features_[i] == "res5avg" || features_[i] == "avgpool";
      // VISSL's AdaptiveAvgPool2d keeps h, w = 1; Largo's pool block flattens.
      features[i] = pooled ? value.reshape({value.size(0), value.size(1), 1, 1}) : value;
    }
  };
  int64_t block = 0;
  if (trunk_name_ == "resnet") { // conv1 is inside the stem, before its max pool
    auto* stem = trunk->ptr(0)->as<ResNetStemImpl>();
    x = stem->forward_conv(std::move(x));
    record(-1, x);
    x = stem->forward_pool(std::move(x));
    record(++block, x);
  }
  for (; block < blocks_run_; ++block) {
    x = (trunk->begin() + block)->forward<at::Tensor>(std::move(x));
    record(block + 1, x);
  }
  return features;
}

std::vector<at::Tensor>
TrunkTaps::forward_vit(const torch::nn::Sequential& frozen, at::Tensor x) const {
  torch::nn::Sequential trunk = frozen; // the same modules; AnyModule::forward is not const
  auto* final_norm = trunk->ptr(trunk->size() - 1)->as<VitFinalNormImpl>();
  const bool class_token = trunk->ptr(0)->as<VitPatchEmbeddingImpl>()->has_class_token();
  const auto layers_run = static_cast<size_t>(blocks_run_ - 1);
  // The layers whose every token a *BLK feature takes; the others are reduced at once.
  std::vector<bool> keep_tokens(layers_run, false);
  for (size_t i = 0; i < features_.size(); ++i) {
    for (const int64_t layer : layers_[i]) {
      keep_tokens[layer] = keep_tokens[layer] || is_block_feature(features_[i]);
    }
  }
  // VISSL's interms: every layer's output through the final norm; reduced to what the
  // features take (the class token, or the mean of all tokens: FeatAvgPool), or kept whole.
  std::vector<at::Tensor> reduced;
  std::vector<at::Tensor> tokens(layers_run);
  x = (trunk->begin())->forward<at::Tensor>(std::move(x));
  for (size_t layer = 0; layer < layers_run; ++layer) {
    x = (trunk->begin() + static_cast<int64_t>(layer) + 1)->forward<at::Tensor>(std::move(x));
    const at::Tensor normed = final_norm->norm_tokens(x); // [b, t, d]
    reduced.push_back(class_token ? normed.select(1, 0) : normed.mean(1));
    if (keep_tokens[layer]) {
      tokens[layer] = normed;
    }
  }
  std::vector<at::Tensor> features;
  for (size_t i = 0; i < features_.size(); ++i) {
    const std::vector<at::Tensor>& source = is_block_feature(features_[i]) ? tokens : reduced;
    std::vector<at::Tensor> parts;
    for (const int64_t layer : layers_[i]) {
      parts.push_back(source[layer]);
    }
    // [b, n d], or [b, t, n d] for *BLK
    features.push_back(parts.size() == 1 ? parts[0] : at::cat(parts, -1));
  }
  return features;
}

} // namespace largo::models
