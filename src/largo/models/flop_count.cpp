#include <largo/models/flop_count.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iterator>

namespace largo::models {
namespace {

// Square maps and kernels throughout the zoo: one side is enough.
struct Counter {
  ModelFlops flops;

  void conv(
      const std::string& name,
      int64_t in,
      int64_t out,
      int64_t kernel,
      int64_t size,
      int64_t groups = 1) {
    flops.layers.push_back({name, conv2d_flops({in, out, kernel, groups, size, size})});
  }
  void linear(const std::string& name, int64_t in, int64_t out, int64_t rows = 1) {
    flops.layers.push_back({name, linear_flops(in, out, rows)});
  }
};

// Returns the side of the stem's output map.
int64_t count_resnet_stem(
    Counter& counter, const ResNetOptions& options, int64_t in_channels, int64_t size) {
  const int64_t channels = resnet_stem_channels(options);
  if (options.stem == "imagenet") {
    size = conv_output_size(size, 7, 2, 3);
    counter.conv("trunk.0.conv1", in_channels, channels, 7, size);
    return conv_output_size(size, 3, 2, 1); // max pool 3x3, stride 2, padding 1
  }
  counter.conv("trunk.0.conv1", in_channels, channels, 3, size);
  return size;
}

int64_t
count_resnet(Counter& counter, const ResNetOptions& options, int64_t in_channels, int64_t size) {
  if (options.stem != "imagenet" && options.stem != "cifar") {
    throw OptionError("ResNetOptions::stem", options.stem, "\"imagenet\" or \"cifar\"");
  }
  size = count_resnet_stem(counter, options, in_channels, size);
  const int64_t expansion = resnet_expansion(options.depth);
  int64_t index = 1;
  for (const ResNetBlockSpec& block : resnet_blocks(options)) {
    const std::string prefix = fmt::format("trunk.{}.", index++);
    const int64_t out_channels = block.planes * expansion;
    const int64_t out_size = conv_output_size(size, 3, block.stride, 1);
    if (expansion == 1) { // BasicBlock: 3x3 (stride) -> 3x3
      counter.conv(prefix + "conv1", block.in_channels, block.planes, 3, out_size);
      counter.conv(prefix + "conv2", block.planes, block.planes, 3, out_size);
    } else { // Bottleneck: 1x1 -> 3x3 (stride, groups) -> 1x1
      const int64_t width = block.planes * options.width_per_group / 64 * options.groups;
      counter.conv(prefix + "conv1", block.in_channels, width, 1, size);
      counter.conv(prefix + "conv2", width, width, 3, out_size, options.groups);
      counter.conv(prefix + "conv3", width, out_channels, 1, out_size);
    }
    if (block.stride != 1 || block.in_channels != out_channels) { // 1x1 projection shortcut
      counter.conv(
          prefix + "downsample.0",
          block.in_channels,
          out_channels,
          1,
          conv_output_size(size, 1, block.stride, 0));
    }
    size = out_size;
  }
  return resnet_blocks(options).back().planes * expansion;
}

// The stem, then per block: the projection (when the shape changes), a (1x1), b (3x3, stride,
// groups), the squeeze-excitation's two 1x1 convs on the pooled 1x1 map, c (1x1).
int64_t
count_regnet(Counter& counter, const RegNetOptions& options, int64_t in_channels, int64_t size) {
  const std::vector<RegNetBlockSpec> blocks = regnet_blocks(options); // validates
  if (options.stem_type == "res_stem_in") {
    size = conv_output_size(size, 7, 2, 3);
    counter.conv("trunk.0.0", in_channels, options.stem_width, 7, size);
    size = conv_output_size(size, 3, 2, 1); // max pool 3x3, stride 2, padding 1
  } else {
    const int64_t stride = options.stem_type == "res_stem_cifar" ? 1 : 2;
    size = conv_output_size(size, 3, stride, 1);
    counter.conv("trunk.0.0", in_channels, options.stem_width, 3, size);
  }
  int64_t index = 1;
  for (const RegNetBlockSpec& block : blocks) {
    const std::string prefix = fmt::format("trunk.{}.", index++);
    const int64_t width = block.bottleneck_width;
    const int64_t out_size = conv_output_size(size, 3, block.stride, 1);
    if (block.projection()) {
      counter.conv(
          prefix + "proj.0",
          block.in_channels,
          block.out_channels,
          1,
          conv_output_size(size, 1, block.stride, 0));
    }
    counter.conv(prefix + "f.a.0", block.in_channels, width, 1, size);
    counter.conv(prefix + "f.b.0", width, width, 3, out_size, block.groups);
    if (block.se_width > 0) {
      counter.conv(prefix + "f.se.fc1", width, block.se_width, 1, 1);
      counter.conv(prefix + "f.se.fc2", block.se_width, width, 1, 1);
    }
    counter.conv(prefix + "f.c.0", width, block.out_channels, 1, out_size);
    size = out_size;
  }
  return blocks.back().out_channels;
}

int64_t count_vit(Counter& counter, const VitOptions& options, int64_t in_channels, int64_t size) {
  if (options.patch_size <= 0 || size % options.patch_size != 0) {
    throw OptionError(
        "VitOptions::patch_size",
        std::to_string(options.patch_size),
        fmt::format("a divisor of the image size {}", size));
  }
  const int64_t d = options.hidden_dim;
  const int64_t patches_per_side = size / options.patch_size;
  counter.conv("trunk.0.conv_proj", in_channels, d, options.patch_size, patches_per_side);
  const int64_t tokens = patches_per_side * patches_per_side + (has_class_token(options) ? 1 : 0);
  for (int64_t layer = 1; layer <= options.num_layers; ++layer) {
    const std::string prefix = fmt::format("trunk.{}.", layer);
    counter.linear(prefix + "qkv", d, 3 * d, tokens);
    counter.flops.layers.push_back({prefix + "attention", attention_flops(tokens, d)});
    counter.linear(prefix + "proj", d, d, tokens);
    counter.linear(prefix + "fc1", d, options.mlp_dim, tokens);
    counter.linear(prefix + "fc2", options.mlp_dim, d, tokens);
  }
  return d;
}

int64_t count_small_cnn(
    Counter& counter, const SmallCnnOptions& options, int64_t in_channels, int64_t size) {
  int64_t channels = in_channels;
  for (size_t stage = 0; stage < options.channels.size(); ++stage) {
    // 3x3 conv, padding 1 (same size), then a 2x2 max pool halves the map.
    counter.conv(fmt::format("trunk.{}.conv", stage), channels, options.channels[stage], 3, size);
    channels = options.channels[stage];
    size /= 2;
  }
  return channels * options.pooled_size * options.pooled_size;
}

// VISSL's resnet_sk (models/resnet_sk.h), its convs named as the built modules are.
int64_t count_resnet_sk(
    Counter& counter, const ResNetSkOptions& options, int64_t in_channels, int64_t size) {
  const std::vector<int64_t> stages = resnet_sk_stage_sizes(options);
  const int64_t w = options.width_multiplier;
  const bool sk = options.sk_ratio > 0;
  const int64_t stem = 64 * w / 2;
  if (sk) { // 3x3/2, 3x3, 3x3
    size = conv_output_size(size, 3, 2, 1);
    counter.conv("trunk.0.0", in_channels, stem, 3, size);
    counter.conv("trunk.0.2", stem, stem, 3, size);
    counter.conv("trunk.0.4", stem, stem * 2, 3, size);
  } else {
    size = conv_output_size(size, 7, 2, 3);
    counter.conv("trunk.0.0", in_channels, stem * 2, 7, size);
  }
  size = conv_output_size(size, 3, 2, 1); // max pool 3x3, stride 2, padding 1
  int64_t channels_in = 64 * w;
  int64_t index = 1;
  for (size_t stage = 0; stage < stages.size(); ++stage) {
    const int64_t channels = (int64_t{64} << stage) * w;
    for (int64_t i = 0; i < stages[stage]; ++i) {
      const std::string prefix = fmt::format("trunk.{}.", index++);
      const int64_t stride = i == 0 && stage > 0 ? 2 : 1;
      const int64_t out_size = conv_output_size(size, 3, stride, 1);
      if (i == 0 && sk) { // zero pad (right, bottom), 2x2 average pool, 1x1 conv
        counter.conv(
            prefix + "projection.shortcut.2",
            channels_in,
            channels * 4,
            1,
            conv_output_size(size + 1, 2, stride, 0));
      } else if (i == 0) {
        counter.conv(
            prefix + "projection.shortcut",
            channels_in,
            channels * 4,
            1,
            conv_output_size(size, 1, stride, 0));
      }
      counter.conv(prefix + "net.0", channels_in, channels, 1, size);
      if (sk) {
        const auto mid = std::max<int64_t>(
            static_cast<int64_t>(static_cast<double>(channels) * options.sk_ratio), 32);
        counter.conv(prefix + "net.2.main_conv.0", channels, 2 * channels, 3, out_size);
        counter.conv(prefix + "net.2.mixing_conv.0", channels, mid, 1, 1);
        counter.conv(prefix + "net.2.mixing_conv.2", mid, 2 * channels, 1, 1);
      } else {
        counter.conv(prefix + "net.2", channels, channels, 3, out_size);
      }
      counter.conv(prefix + (sk ? "net.3" : "net.4"), channels, channels * 4, 1, out_size);
      channels_in = channels * 4;
      size = out_size;
    }
  }
  return channels_in;
}

int64_t count_trunk(Counter& counter, const ModelOptions& options) {
  const int64_t in = options.in_channels;
  const int64_t size = options.image_size;
  if (in <= 0 || size <= 0) {
    throw ConfigError(fmt::format(
        "the model needs a positive input shape; got {} channels of {}x{} pixels", in, size, size));
  }
  const std::string& name = options.trunk_name;
  if (name == "resnet") {
    return count_resnet(counter, options.resnet, in, size);
  }
  if (name == "resnet_sk") {
    return count_resnet_sk(counter, options.resnet_sk, in, size);
  }
  if (name == "regnet") {
    return count_regnet(counter, options.regnet, in, size);
  }
  if (name == "vision_transformer") {
    return count_vit(counter, options.vit, in, size);
  }
  if (name == "small_cnn") {
    return count_small_cnn(counter, options.small_cnn, in, size);
  }
  if (name == "mlp") {
    int64_t features = in * size * size;
    for (size_t i = 0; i < options.mlp.hidden_dims.size(); ++i) {
      counter.linear(fmt::format("trunk.{}.linear", i), features, options.mlp.hidden_dims[i]);
      features = options.mlp.hidden_dims[i];
    }
    return features;
  }
  throw OptionError(
      "ModelOptions::trunk_name",
      name,
      fmt::format("one of: {}", fmt::join(supported_trunk_names(), ", ")));
}

// The Linear layers of heads run one after another, under build_head_chain's flat names.
void count_head_chain(Counter& counter, const std::vector<MlpHeadSpec>& chain) {
  size_t first = 0; // the head's first layer in the chain
  for (const MlpHeadSpec& head : chain) {
    size_t index = first;
    size_t linear = 0;
    for (const MlpLayer layer : mlp_head_layers(head.dims.size(), head.options)) {
      if (layer == MlpLayer::kLinear) {
        counter.linear(fmt::format("head.{}", index), head.dims[linear], head.dims[linear + 1]);
        ++linear;
      }
      ++index;
    }
    first += head_chain_layers(head);
  }
}

} // namespace

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

int64_t conv2d_flops(const Conv2dShape& shape) {
  return 2 * shape.out_height * shape.out_width * shape.out_channels *
         (shape.in_channels / shape.groups) * shape.kernel * shape.kernel;
}

int64_t linear_flops(int64_t in_features, int64_t out_features, int64_t rows) {
  return 2 * rows * in_features * out_features;
}

int64_t attention_flops(int64_t tokens, int64_t hidden_dim) {
  return 2 * (2 * tokens * tokens * hidden_dim);
}

int64_t ModelFlops::forward_per_sample() const {
  int64_t total = 0;
  for (const LayerFlops& layer : layers) {
    total += layer.forward_flops;
  }
  return total;
}

ModelFlops count_model_flops(const ModelOptions& options) {
  Counter counter;
  const int64_t features = count_trunk(counter, options);
  if (!options.head_chain.empty()) {
    count_head_chain(counter, options.head_chain);
  } else if (options.head_dims.empty()) {
    counter.linear("head.0", features, options.num_classes);
  } else {
    // Module indices as build_mlp_head numbers them: BN / ReLU / Dropout sit between Linears.
    const auto& dims = options.head_dims;
    const int64_t extra = (options.head.use_bn ? 1 : 0) + (options.head.use_relu ? 1 : 0) +
                          (options.head.use_dropout ? 1 : 0);
    // eval_mlp's Linears sit in head.0.clf.clf (its BatchNorm's flops are not counted, as
    // the mlp head's are not).
    const std::string prefix = options.head_channel_bn > 0 ? "head.0.clf.clf." : "head.";
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      counter.linear(fmt::format("{}{}", prefix, i * (1 + extra)), dims[i], dims[i + 1]);
    }
  }
  return counter.flops;
}

int64_t training_flops_per_sample(const ModelOptions& options) {
  if (options.view_shapes.empty()) {
    return count_model_flops(options).training_per_sample();
  }
  int64_t flops = 0;
  for (size_t k = 0; k < options.view_shapes.size(); ++k) {
    const auto& shape = options.view_shapes[k]; // [channels, h, w]; trunks take square views
    ModelOptions view = options;
    view.view_shapes.clear();
    view.image_size = shape[1];
    const ModelFlops counted = count_model_flops(view);
    // MoCo's view 1 only runs forward, through the momentum encoder.
    flops += options.moco && k == 1 ? counted.forward_per_sample() : counted.training_per_sample();
    // DINO's teacher runs forward on its crops besides the student's training pass.
    const auto& teacher_crops =
        options.dino ? options.dino->crops_for_teacher : std::vector<int64_t>{};
    const auto teacher_runs =
        std::count(teacher_crops.begin(), teacher_crops.end(), static_cast<int64_t>(k));
    flops += teacher_runs * counted.forward_per_sample();
  }
  return flops;
}

int64_t
linear_eval_training_flops_per_sample(const ModelOptions& options, int64_t trunk_blocks_run) {
  const FeatureEvalOptions& eval = options.feature_eval;
  int64_t trunk = 0;
  int64_t heads = 0;
  for (const LayerFlops& layer : count_model_flops(options).layers) {
    if (layer.name.rfind("trunk.", 0) == 0) {
      const int64_t block = std::stoll(layer.name.substr(6)); // "trunk.<block>.<layer>"
      trunk += block < trunk_blocks_run ? layer.forward_flops : 0;
    } else if (eval.taps.empty()) {
      heads += layer.forward_flops; // the pretrained head
    }
  }
  for (const EvalHeadOptions& head : eval.heads) {
    for (size_t i = 0; i + 1 < head.dims.size(); ++i) {
      heads += linear_flops(head.dims[i], head.dims[i + 1]);
    }
  }
  return trunk + (eval.freeze_trunk_and_head ? 1 : 3) * heads;
}

std::string format_flops(double flops) {
  static const char* const prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  size_t prefix = 0;
  while (std::abs(flops) >= 999.5 && prefix + 1 < std::size(prefixes)) {
    flops /= 1000.0;
    ++prefix;
  }
  return fmt::format("{:.3g} {}FLOP", flops, prefixes[prefix]);
}

} // namespace largo::models
