#include <largo/models/dino_head.h>

#include <largo/core/error.h>
#include <largo/models/vit.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/functional/normalization.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>

#include <cmath>

namespace largo::models {
namespace {

void validate_dino_head(const DinoHeadOptions& options) {
  const auto positive = [](int64_t value, const char* field) {
    require_option(
        value > 0,
        fmt::format("DinoHeadOptions::{}", field),
        std::to_string(value),
        "an integer > 0");
  };
  positive(options.in_dim, "in_dim");
  positive(options.num_clusters, "num_clusters");
  positive(options.hidden_dim, "hidden_dim");
  positive(options.bottleneck_dim, "bottleneck_dim");
  require_option(
      options.num_layers >= 1,
      "DinoHeadOptions::num_layers",
      std::to_string(options.num_layers),
      "an integer >= 1");
}

// DINOHead._init_weights on one Linear, applied (as VISSL's self.apply) after every layer of the
// MLP is built with nn.Linear's default init: the same draws in the same order as VISSL's, so
// one seed gives VISSL's initial values.
void dino_init_linear(torch::nn::LinearImpl& linear) {
  torch::NoGradGuard no_grad;
  trunc_normal_(linear.weight, 0.02); // VISSL's, absolute bounds (models/vit.h)
  linear.bias.zero_();
}

// VISSL's layer list: Linear [BN] GELU per hidden layer, then the Linear to the bottleneck.
torch::nn::Sequential build_dino_mlp(const DinoHeadOptions& options) {
  torch::nn::Sequential mlp;
  int64_t in = options.in_dim;
  for (int64_t layer = 0; layer + 1 < options.num_layers; ++layer) {
    mlp->push_back(torch::nn::Linear(in, options.hidden_dim));
    if (options.use_bn) {
      mlp->push_back(torch::nn::BatchNorm1d(options.hidden_dim));
    }
    mlp->push_back(torch::nn::GELU());
    in = options.hidden_dim;
  }
  mlp->push_back(torch::nn::Linear(in, options.bottleneck_dim));
  for (const auto& layer : *mlp) {
    if (auto* linear = layer.ptr()->as<torch::nn::LinearImpl>()) {
      dino_init_linear(*linear);
    }
  }
  return mlp;
}

} // namespace

DinoPrototypesImpl::DinoPrototypesImpl(int64_t in_features, int64_t out_features, bool train_norm) {
  // Registered g first, then v: the order torch.nn.utils.weight_norm leaves them in.
  weight_g = register_parameter("weight_g", torch::ones({out_features, 1}), train_norm);
  at::Tensor v = torch::empty({out_features, in_features});
  torch::nn::init::kaiming_uniform_(v, std::sqrt(5.0)); // nn.Linear's default weight
  weight_v = register_parameter("weight_v", v);
}

at::Tensor DinoPrototypesImpl::forward(const at::Tensor& x) {
  // WeightNorm.compute_weight: torch._weight_norm(v, g, dim=0).
  return at::linear(x, at::_weight_norm(weight_v, weight_g, 0));
}

DinoHeadImpl::DinoHeadImpl(const DinoHeadOptions& options) : options_(options) {
  validate_dino_head(options_);
  if (options_.num_layers == 1) {
    mlp_linear_ =
        register_module("mlp", torch::nn::Linear(options_.in_dim, options_.bottleneck_dim));
    dino_init_linear(*mlp_linear_);
  } else {
    mlp_ = register_module("mlp", build_dino_mlp(options_));
  }
  prototypes_ = register_module(
      "prototypes0",
      DinoPrototypes(
          options_.bottleneck_dim, options_.num_clusters, !options_.normalize_last_layer));
}

// The Linear layers through at::linear (one addmm with the bias, as PyTorch's nn.Linear runs
// a 2-D input) rather than libtorch's Linear::forward, whose matmul-then-add rounds differently.
at::Tensor DinoHeadImpl::run_mlp(const at::Tensor& features) {
  if (mlp_linear_) {
    return at::linear(features, mlp_linear_->weight, mlp_linear_->bias);
  }
  at::Tensor x = features;
  for (auto& layer : *mlp_) {
    if (const auto* linear = layer.ptr()->as<torch::nn::LinearImpl>()) {
      x = at::linear(x, linear->weight, linear->bias);
    } else {
      x = layer.forward(x);
    }
  }
  return x;
}

at::Tensor DinoHeadImpl::forward(const at::Tensor& features) {
  const at::Tensor embedding = torch::nn::functional::normalize(
      run_mlp(features), torch::nn::functional::NormalizeFuncOptions().p(2).dim(-1));
  return prototypes_->forward(embedding);
}

} // namespace largo::models
