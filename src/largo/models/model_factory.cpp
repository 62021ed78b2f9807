#include <largo/models/model_factory.h>

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/core/resources.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/linear.h>

namespace largo::models {

const std::vector<std::string>& supported_trunk_names() {
  static const std::vector<std::string> names{
      "mlp", "small_cnn", "resnet", "resnet_sk", "regnet", "vision_transformer"};
  return names;
}

Trunk build_trunk(const ModelOptions& options) {
  if (options.in_channels <= 0 || options.image_size <= 0) {
    throw ConfigError(fmt::format(
        "the model needs a positive input shape; got {} channels of {}x{} pixels",
        options.in_channels,
        options.image_size,
        options.image_size));
  }
  const std::string& name = options.trunk_name;
  if (name == "mlp") {
    return build_mlp_trunk(options.mlp, options.in_channels, options.image_size);
  }
  if (name == "small_cnn") {
    return build_small_cnn_trunk(options.small_cnn, options.in_channels, options.image_size);
  }
  if (name == "resnet") {
    return build_resnet_trunk(options.resnet, options.in_channels);
  }
  if (name == "resnet_sk") {
    return build_resnet_sk_trunk(options.resnet_sk, options.in_channels);
  }
  if (name == "regnet") {
    return build_regnet_trunk(options.regnet, options.in_channels);
  }
  if (name == "vision_transformer") {
    return build_vit_trunk(options.vit, options.in_channels, options.image_size);
  }
  throw OptionError(
      "ModelOptions::trunk_name",
      name,
      fmt::format("one of: {}", fmt::join(supported_trunk_names(), ", ")));
}

namespace {

// The eval_mlp head of options.head_channel_bn over a trunk of `trunk_width` outputs.
EvalHeadOptions eval_mlp_head_options(const ModelOptions& options, int64_t trunk_width) {
  if (options.head_channel_bn != trunk_width) {
    throw OptionError(
        "ModelOptions::head_channel_bn",
        std::to_string(options.head_channel_bn),
        fmt::format(
            "the {} trunk's output width {} (its BatchNorm normalizes the trunk's channels)",
            options.trunk_name,
            trunk_width));
  }
  EvalHeadOptions head;
  head.name = "eval_mlp";
  head.in_channels = options.head_channel_bn;
  head.dims = options.head_dims;
  head.mlp = options.head;
  return head;
}

// MODEL.HEAD.PARAMS_MULTIPLIER: VISSL's mlp heads scale their Linear weights and biases
// (MLP.scale_weights); in a chain, a swav_head's projection does not.
void scale_head_weights(torch::nn::Sequential& head, const ModelOptions& options) {
  std::vector<bool> scaled(head->size(), true);
  size_t first = 0;
  for (const MlpHeadSpec& spec : options.head_chain) {
    const size_t layers = head_chain_layers(spec);
    std::fill_n(
        scaled.begin() + static_cast<std::ptrdiff_t>(first), layers, spec.vissl_module == "clf");
    first += layers;
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < head->size(); ++i) {
    if (!scaled[i]) {
      continue;
    }
    for (auto& module : head[i]->modules(/*include_self=*/true)) {
      if (auto* linear = module->as<torch::nn::Linear>()) {
        linear->weight.mul_(options.head_params_multiplier);
        if (linear->bias.defined()) {
          linear->bias.mul_(options.head_params_multiplier);
        }
      }
    }
  }
}

} // namespace

TrunkHeadModel build_model(const ModelOptions& options) {
  // Names what asks when a layer is larger than the memory (core/resources.h).
  AllocationContext context(fmt::format(
      "building the model (ModelOptions::trunk_name = {}, "
      "its sizes and {} classes)",
      options.trunk_name,
      options.num_classes));
  Trunk trunk = build_trunk(options);
  torch::nn::Sequential head;
  // VISSL scales its mlp heads' weights (MLP.scale_weights); swav_head and dino_head take no
  // multiplier.
  const bool swav = !options.swav_head.dims.empty();
  if (swav) {
    if (options.swav_head.dims.front() != trunk.output_dim) {
      throw OptionError(
          "SwavHeadOptions::dims",
          fmt::format("[{}]", fmt::join(options.swav_head.dims, ", ")),
          fmt::format(
              "the first dim to equal the {} trunk's output width {}",
              options.trunk_name,
              trunk.output_dim));
    }
    head->push_back(SwavHead(options.swav_head));
  } else if (options.dino_head.in_dim > 0) {
    if (options.dino_head.in_dim != trunk.output_dim) {
      throw OptionError(
          "DinoHeadOptions::in_dim",
          std::to_string(options.dino_head.in_dim),
          fmt::format("the {} trunk's output width {}", options.trunk_name, trunk.output_dim));
    }
    head->push_back(DinoHead(options.dino_head));
  } else if (!options.head_chain.empty()) {
    head = build_head_chain(trunk.output_dim, options.head_chain);
  } else if (options.head_dims.empty()) {
    head = build_linear_head(trunk.output_dim, options.num_classes);
  } else {
    const auto& dims = options.head_dims;
    const std::string dims_text = fmt::format("[{}]", fmt::join(dims, ", "));
    if (dims.front() != trunk.output_dim) {
      throw OptionError(
          "ModelOptions::head_dims",
          dims_text,
          fmt::format(
              "the first dim to equal the {} trunk's output width {}",
              options.trunk_name,
              trunk.output_dim));
    }
    if (options.num_classes > 0 && dims.back() != options.num_classes) {
      throw OptionError(
          "ModelOptions::head_dims",
          dims_text,
          fmt::format("the last dim to equal the number of classes {}", options.num_classes));
    }
    if (options.head_channel_bn > 0) {
      head->push_back(EvalMlpHead(eval_mlp_head_options(options, trunk.output_dim)));
    } else {
      head = build_mlp_head(dims, options.head);
    }
  }
  if (options.head_params_multiplier != 1.0 && !swav && options.dino_head.in_dim == 0) {
    scale_head_weights(head, options);
  }
  return TrunkHeadModel(std::move(trunk), std::move(head));
}

std::shared_ptr<torch::nn::Module> RunModel::module() const {
  if (linear_eval) {
    return linear_eval.ptr();
  }
  if (multi_crop) {
    return multi_crop.ptr();
  }
  if (moco) {
    return moco.ptr();
  }
  if (dino) {
    return dino.ptr();
  }
  return model.ptr();
}

torch::nn::AnyModule RunModel::any_module() const {
  if (linear_eval) {
    return torch::nn::AnyModule(linear_eval);
  }
  if (moco) {
    return torch::nn::AnyModule(moco);
  }
  if (dino) {
    return torch::nn::AnyModule(dino);
  }
  return multi_crop ? torch::nn::AnyModule(multi_crop) : torch::nn::AnyModule(model);
}

std::vector<int64_t> RunModel::output_widths() const {
  return linear_eval ? linear_eval->output_widths() : std::vector<int64_t>{};
}

RunModel build_run_model(const ModelOptions& options) {
  RunModel run;
  run.model = build_model(options);
  if (options.feature_eval.enabled()) {
    run.linear_eval = LinearEvalModel(run.model, options.feature_eval);
  } else if (!options.view_shapes.empty() && options.moco) {
    run.moco = MocoModel(run.model, build_model(options), options.view_shapes, *options.moco);
  } else if (!options.view_shapes.empty() && options.dino) {
    ModelOptions teacher = options; // VISSL's teacher: the same model without stochastic depth
    teacher.vit.drop_path_rate = 0.0;
    run.dino = DinoModel(run.model, build_model(teacher), options.view_shapes, *options.dino);
  } else if (!options.view_shapes.empty()) {
    run.multi_crop = MultiCropModel(run.model, options.view_shapes, options.pad_views);
  }
  return run;
}

} // namespace largo::models
