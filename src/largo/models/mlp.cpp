#include <largo/models/mlp.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::models {

MlpBlockImpl::MlpBlockImpl(
    int64_t in_features, int64_t out_features, bool flatten_input, double dropout)
    : flatten_input_(flatten_input), dropout_(dropout) {
  if (out_features > 0) {
    linear_ = register_module("linear", torch::nn::Linear(in_features, out_features));
  }
}

at::Tensor MlpBlockImpl::forward(at::Tensor x) {
  if (flatten_input_) {
    x = x.flatten(1); // [b, c, h, w] -> [b, c*h*w]
  }
  if (!parallel_linear_.is_empty()) {
    x = parallel_linear_.forward<at::Tensor>(x).relu_();
  } else if (linear_) {
    x = linear_(x).relu_();
  } else {
    return x;
  }
  if (dropout_ > 0.0) {
    x = at::dropout(x, dropout_, is_training());
  }
  return x;
}

void MlpBlockImpl::use_tensor_parallel_linear(torch::nn::AnyModule parallel) {
  replace_module("linear", parallel.ptr());
  linear_ = nullptr; // the full weight is no longer this block's
  parallel_linear_ = std::move(parallel);
}

Trunk build_mlp_trunk(const MlpOptions& options, int64_t in_channels, int64_t image_size) {
  const auto& dims = options.hidden_dims;
  if (!std::all_of(dims.begin(), dims.end(), [](int64_t dim) { return dim > 0; })) {
    throw OptionError(
        "MlpOptions::hidden_dims",
        fmt::format("[{}]", fmt::join(dims, ", ")),
        "layer widths > 0 (an empty list means no hidden layer)");
  }
  if (!(options.dropout >= 0.0 && options.dropout < 1.0)) {
    throw OptionError(
        "MlpOptions::dropout", fmt::format("{}", options.dropout), "a rate in [0, 1)");
  }
  if (in_channels <= 0 || image_size <= 0) {
    throw ConfigError(fmt::format(
        "the mlp trunk needs a positive input shape, got {} channels of {}x{} pixels",
        in_channels,
        image_size,
        image_size));
  }
  int64_t features = in_channels * image_size * image_size;
  torch::nn::Sequential blocks;
  if (dims.empty()) {
    blocks->push_back(MlpBlock(features, 0, /*flatten_input=*/true, 0.0));
    return Trunk{blocks, features};
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    blocks->push_back(MlpBlock(features, dims[i], /*flatten_input=*/i == 0, options.dropout));
    features = dims[i];
  }
  return Trunk{blocks, features};
}

} // namespace largo::models
