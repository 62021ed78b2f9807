#include <largo/models/swav_head.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/normalization.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>

#include <algorithm>

namespace largo::models {
namespace {

bool all_positive(const std::vector<int64_t>& values) {
  return std::all_of(values.begin(), values.end(), [](int64_t v) { return v > 0; });
}

void validate(const SwavHeadOptions& options) {
  if (options.dims.size() < 2 || !all_positive(options.dims)) {
    throw OptionError(
        "SwavHeadOptions::dims",
        fmt::format("[{}]", fmt::join(options.dims, ", ")),
        "at least two dims [in, ..., embedding], all > 0");
  }
  if (!all_positive(options.num_clusters)) {
    throw OptionError(
        "SwavHeadOptions::num_clusters",
        fmt::format("[{}]", fmt::join(options.num_clusters, ", ")),
        "a list of prototype counts, each > 0");
  }
  if (options.activation != "ReLU" && options.activation != "GELU") {
    throw OptionError("SwavHeadOptions::activation", options.activation, "ReLU or GELU");
  }
}

// VISSL's loop: Linear, then (unless it is the last and skip_last_bn) BN and the activation.
torch::nn::Sequential build_projection(const SwavHeadOptions& options) {
  torch::nn::Sequential head;
  const std::vector<int64_t>& dims = options.dims;
  for (size_t i = 1; i < dims.size(); ++i) {
    head->push_back(
        torch::nn::Linear(torch::nn::LinearOptions(dims[i - 1], dims[i]).bias(options.use_bias)));
    if (i + 1 == dims.size() && options.skip_last_bn) {
      break;
    }
    if (options.use_bn) {
      head->push_back(torch::nn::BatchNorm1d(torch::nn::BatchNormOptions(dims[i])
                                                 .eps(options.batchnorm_eps)
                                                 .momentum(options.batchnorm_momentum)));
    }
    if (options.activation == "ReLU") {
      head->push_back(torch::nn::ReLU());
    } else {
      head->push_back(torch::nn::GELU());
    }
  }
  return head;
}

} // namespace

SwavHeadImpl::SwavHeadImpl(SwavHeadOptions options) : options_(std::move(options)) {
  validate(options_);
  projection_head_ = register_module("projection_head", build_projection(options_));
  for (size_t j = 0; j < options_.num_clusters.size(); ++j) {
    prototypes_.push_back(register_module(
        fmt::format("prototypes{}", j),
        torch::nn::Linear(
            torch::nn::LinearOptions(options_.dims.back(), options_.num_clusters[j]).bias(false))));
  }
}

std::vector<at::Tensor> SwavHeadImpl::forward(const at::Tensor& features) {
  at::Tensor embedding = projection_head_->forward(features);
  if (options_.normalize_feats) {
    embedding = torch::nn::functional::normalize(
        embedding, torch::nn::functional::NormalizeFuncOptions().p(2).dim(1));
  }
  std::vector<at::Tensor> outputs;
  if (options_.return_embeddings) {
    outputs.push_back(embedding);
  }
  for (auto& prototypes : prototypes_) {
    outputs.push_back(prototypes->forward(embedding));
  }
  return outputs;
}

void SwavHeadImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_sequential_member(*this, name, replacement, {{"projection_head", &projection_head_}});
}

void SwavHeadImpl::normalize_prototypes() {
  for (auto& prototypes : prototypes_) {
    normalize_prototype_rows(prototypes->weight);
  }
}

void SwavHeadImpl::normalize_prototype_rows(at::Tensor& weight) {
  torch::NoGradGuard no_grad;
  weight.copy_(torch::nn::functional::normalize(
      weight, torch::nn::functional::NormalizeFuncOptions().p(2).dim(1)));
}

} // namespace largo::models
