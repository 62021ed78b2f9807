#include <largo/models/heads.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/normalization.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

namespace largo::models {

torch::nn::Sequential build_linear_head(int64_t in_features, int64_t num_classes) {
  if (num_classes <= 0) {
    throw ConfigError(
        fmt::format("the linear head needs a number of classes > 0, got {}", num_classes));
  }
  torch::nn::Sequential head;
  head->push_back(torch::nn::Linear(in_features, num_classes));
  return head;
}

torch::nn::Sequential
build_mlp_head(const std::vector<int64_t>& dims, const MlpHeadOptions& options) {
  const bool dims_positive =
      std::all_of(dims.begin(), dims.end(), [](int64_t dim) { return dim > 0; });
  if (dims.size() < 2 || !dims_positive) {
    throw OptionError(
        "MlpHeadSpec::dims",
        fmt::format("[{}]", fmt::join(dims, ", ")),
        "at least two dims [in, ..., out], all > 0");
  }
  torch::nn::Sequential head;
  size_t linear = 0; // the Linear layers made so far
  for (const MlpLayer layer : mlp_head_layers(dims.size(), options)) {
    const int64_t width = dims[linear];
    switch (layer) {
    case MlpLayer::kLinear:
      head->push_back(torch::nn::Linear(
          torch::nn::LinearOptions(dims[linear], dims[linear + 1]).bias(options.use_bias)));
      ++linear;
      break;
    case MlpLayer::kBatchNorm:
      head->push_back(torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(width)
                                                 .eps(options.batchnorm_eps)
                                                 .momentum(options.batchnorm_momentum)));
      break;
    case MlpLayer::kReLU:
      head->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
      break;
    case MlpLayer::kDropout:
      head->push_back(torch::nn::Dropout(0.5));
      break;
    }
  }
  return head;
}

std::vector<MlpLayer> mlp_head_layers(size_t num_dims, const MlpHeadOptions& options) {
  std::vector<MlpLayer> layers;
  const size_t num_linear = num_dims < 2 ? 0 : num_dims - 1;
  for (size_t i = 0; i < num_linear; ++i) {
    layers.push_back(MlpLayer::kLinear);
    if (i + 1 == num_linear && options.skip_last_layer_relu_bn) {
      break;
    }
    if (options.use_bn) {
      layers.push_back(MlpLayer::kBatchNorm);
    }
    if (options.use_relu) {
      layers.push_back(MlpLayer::kReLU);
    }
    if (options.use_dropout) {
      layers.push_back(MlpLayer::kDropout);
    }
  }
  return layers;
}

size_t head_chain_layers(const MlpHeadSpec& head) {
  return mlp_head_layers(head.dims.size(), head.options).size() + (head.normalize_output ? 1 : 0);
}

torch::nn::Sequential build_head_chain(int64_t in_features, const std::vector<MlpHeadSpec>& heads) {
  torch::nn::Sequential chain;
  int64_t width = in_features;
  for (size_t i = 0; i < heads.size(); ++i) {
    const std::vector<int64_t>& dims = heads[i].dims;
    if (dims.empty() || dims.front() != width) {
      throw OptionError(
          fmt::format("ModelOptions::head_chain[{}].dims", i),
          fmt::format("[{}]", fmt::join(dims, ", ")),
          fmt::format(
              "the first dim to equal the width of what feeds it ({}: {})",
              i == 0 ? "the trunk's output" : "the previous head's output",
              width));
    }
    const torch::nn::Sequential head = build_mlp_head(dims, heads[i].options);
    for (const auto& layer : *head) {
      chain->push_back(layer); // flat: a Sequential cannot hold a Sequential
    }
    if (heads[i].normalize_output) { // VISSL's swav_head: F.normalize(x, dim=1, p=2)
      chain->push_back(torch::nn::Functional([](const at::Tensor& x) {
        return torch::nn::functional::normalize(
            x, torch::nn::functional::NormalizeFuncOptions().p(2).dim(1));
      }));
    }
    width = dims.back();
  }
  return chain;
}

} // namespace largo::models
