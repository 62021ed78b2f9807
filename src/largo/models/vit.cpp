#include <largo/models/vit.h>

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/core/shard_random_stream.h>
#include <largo/kernels/add_layer_norm.h>
#include <largo/kernels/bias_gelu.h>
#include <largo/models/vit_position_interpolation.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/init.h>

#include <cmath>

namespace largo::models {
namespace {

constexpr double kLayerNormEps = 1e-6; // VISSL's and torchvision's ViT

torch::nn::LayerNorm layer_norm(int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(kLayerNormEps));
}

void require_positive(int64_t value, const std::string& field) {
  require_option(value > 0, "VitOptions::" + field, std::to_string(value), "an integer > 0");
}

void require_rate(double value, const std::string& field) {
  require_option(
      value >= 0.0 && value < 1.0,
      "VitOptions::" + field,
      fmt::format("{}", value),
      "a rate in [0, 1)");
}

int64_t validate_vit(const VitOptions& options, int64_t in_channels, int64_t input_size) {
  if (in_channels <= 0 || input_size <= 0) {
    throw ConfigError(fmt::format(
        "vision_transformer needs a positive input shape, got {} channels of {}x{} pixels",
        in_channels,
        input_size,
        input_size));
  }
  if (options.image_size < 0) {
    throw OptionError(
        "VitOptions::image_size",
        std::to_string(options.image_size),
        "an integer > 0 (or 0 = the data's)");
  }
  if (options.image_size > 0 && options.image_size != input_size) {
    throw OptionError(
        "VitOptions::image_size",
        std::to_string(options.image_size),
        fmt::format("the size of the input images, {}", input_size));
  }
  require_positive(options.patch_size, "patch_size");
  if (input_size % options.patch_size != 0) {
    throw OptionError(
        "VitOptions::patch_size",
        std::to_string(options.patch_size),
        fmt::format("a divisor of the image size {}", input_size));
  }
  require_positive(options.num_layers, "num_layers");
  require_positive(options.num_heads, "num_heads");
  require_positive(options.hidden_dim, "hidden_dim");
  require_positive(options.mlp_dim, "mlp_dim");
  if (options.hidden_dim % options.num_heads != 0) {
    throw OptionError(
        "VitOptions::num_heads",
        std::to_string(options.num_heads),
        fmt::format("a divisor of VitOptions::hidden_dim {}", options.hidden_dim));
  }
  require_rate(options.dropout, "dropout");
  require_rate(options.attention_dropout, "attention_dropout");
  require_rate(options.drop_path_rate, "drop_path_rate");
  if (options.classifier != "token" && options.classifier != "gap") {
    throw OptionError("VitOptions::classifier", options.classifier, "\"token\" or \"gap\"");
  }
  return input_size;
}

// [b, t, in] -> [b, t, out] through at::linear, as PyTorch's nn.Linear runs it: for a
// contiguous 3-D input one addmm with the bias as its starting value. libtorch's C++ Linear
// module (torch::nn::functional::linear) instead runs matmul and then adds the bias in a second
// pass over the output: one more read and write of every activation, and rounding that differs
// from PyTorch's once the biases are non-zero.
at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

void init_linear(torch::nn::Linear& linear) {
  trunc_normal_(linear->weight, 0.02);
  if (linear->bias.defined()) {
    torch::NoGradGuard no_grad;
    linear->bias.zero_();
  }
}

} // namespace

void trunc_normal_(at::Tensor tensor, double std) {
  torch::NoGradGuard no_grad;
  // VISSL's (and timm's) trunc_normal_ with its default bounds a = -2, b = 2, which are
  // absolute, not in units of std: uniform on [2 cdf(a / std) - 1, 2 cdf(b / std) - 1]
  // mapped through the inverse normal CDF, scaled, then clamped to [a, b].
  const auto cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  tensor.uniform_(2.0 * cdf(-2.0 / std) - 1.0, 2.0 * cdf(2.0 / std) - 1.0);
  tensor.erfinv_();
  tensor.mul_(std * std::sqrt(2.0));
  tensor.clamp_(-2.0, 2.0);
}

VitPatchEmbeddingImpl::VitPatchEmbeddingImpl(
    int64_t in_channels,
    int64_t image_size,
    int64_t patch_size,
    int64_t hidden_dim,
    double dropout,
    bool class_token)
    : image_size_(image_size), patch_size_(patch_size), dropout_(dropout) {
  conv_proj_ = register_module(
      "conv_proj",
      torch::nn::Conv2d(
          torch::nn::Conv2dOptions(in_channels, hidden_dim, patch_size).stride(patch_size)));
  const int64_t patches_per_side = image_size / patch_size;
  int64_t num_tokens = patches_per_side * patches_per_side;
  if (class_token) {
    class_token_ = register_parameter("class_token", torch::empty({1, 1, hidden_dim}));
    trunc_normal_(class_token_, 0.02);
    num_tokens += 1;
  }
  pos_embedding_ = register_parameter("pos_embedding", torch::empty({1, num_tokens, hidden_dim}));
  trunc_normal_(pos_embedding_, 0.02);
}

// Inputs of another size than image_size_ (DINO's local crops) get the positional embedding
// interpolated to their patch grid, as VISSL's interpolate_pos_encoding; VISSL allows that
// with a class token only, and so does Largo.
int64_t VitPatchEmbeddingImpl::input_grid(const at::Tensor& x) const {
  const bool square = x.dim() == 4 && x.size(2) == x.size(3);
  if (!square || x.size(2) % patch_size_ != 0) {
    throw Error(fmt::format(
        "vision_transformer takes square images whose side is a multiple of "
        "VitOptions::patch_size {} (it was built for {}x{}), but got input of shape [{}]",
        patch_size_,
        image_size_,
        image_size_,
        fmt::join(x.sizes(), "x")));
  }
  if (x.size(2) != image_size_ && !class_token_.defined()) {
    throw Error(fmt::format(
        "vision_transformer without a class token (VitOptions::use_class_token false or "
        "VitOptions::classifier gap) takes only the {}x{} images it was built for "
        "(VitOptions::image_size), as VISSL asserts, but got input of shape [{}]; use a class "
        "token to take other sizes, or inputs of that size",
        image_size_,
        image_size_,
        fmt::join(x.sizes(), "x")));
  }
  return x.size(2) / patch_size_;
}

at::Tensor VitPatchEmbeddingImpl::forward(at::Tensor x) {
  const int64_t grid = input_grid(x);
  x = conv_proj_(x);                // [b, d, h/p, w/p]
  x = x.flatten(2).transpose(1, 2); // [b, n, d]
  if (class_token_.defined()) {
    x = at::cat({class_token_.expand({x.size(0), -1, -1}), x}, 1); // [b, n+1, d]
  }
  const int64_t built_grid = image_size_ / patch_size_;
  x = x + (grid == built_grid ? pos_embedding_
                              : interpolate_position_embedding(pos_embedding_, built_grid, grid));
  return at::dropout(x, dropout_, is_training());
}

VitEncoderLayerImpl::VitEncoderLayerImpl(const VitEncoderLayerOptions& options)
    : options_(options) {
  const int64_t d = options.hidden_dim;
  norm1_ = register_module("norm1", layer_norm(d));
  qkv_ = register_module(
      "qkv", torch::nn::Linear(torch::nn::LinearOptions(d, 3 * d).bias(options.qkv_bias)));
  proj_ = register_module("proj", torch::nn::Linear(d, d));
  norm2_ = register_module("norm2", layer_norm(d));
  fc1_ = register_module("fc1", torch::nn::Linear(d, options.mlp_dim));
  fc2_ = register_module("fc2", torch::nn::Linear(options.mlp_dim, d));
  for (auto* linear : {&qkv_, &proj_, &fc1_, &fc2_}) {
    init_linear(*linear);
  }
}

void VitEncoderLayerImpl::use_tensor_parallel_linears(TensorParallelLinears linears) {
  replace_module("qkv", linears.qkv.ptr());
  replace_module("proj", linears.proj.ptr());
  replace_module("fc1", linears.fc1.ptr());
  replace_module("fc2", linears.fc2.ptr());
  qkv_ = proj_ = fc1_ = fc2_ = nullptr; // the full weights are no longer this layer's
  tensor_parallel_ = std::move(linears);
}

at::Tensor VitEncoderLayerImpl::dense(
    const torch::nn::Linear& full, torch::nn::AnyModule& parallel, const at::Tensor& x) {
  return parallel.is_empty() ? linear(full, x) : parallel.forward<at::Tensor>(x);
}

at::Tensor VitEncoderLayerImpl::norm(torch::nn::LayerNorm& layer, const at::Tensor& x) {
  if (!sequence_parallel()) {
    return layer->forward(x);
  }
  return at::layer_norm(
      x,
      layer->options.normalized_shape(),
      norm_parameter(layer->weight),
      norm_parameter(layer->bias),
      layer->options.eps());
}

at::Tensor VitEncoderLayerImpl::norm_parameter(const at::Tensor& parameter) {
  return sequence_parallel() ? tensor_parallel_.sequence.sum_gradient_over_shards(parameter)
                             : parameter;
}

at::Tensor VitEncoderLayerImpl::in_random_stream(
    bool sharded, const at::Tensor& x, const std::function<at::Tensor()>& region) {
  if (!sharded || tensor_parallel_.qkv.is_empty()) {
    return region();
  }
  return run_in_shard_random_stream(tensor_parallel_.shard_index, x.device(), region);
}

at::Tensor VitEncoderLayerImpl::attention(const at::Tensor& x) {
  const int64_t batch = x.size(0);
  // Under tensor parallelism this rank's heads only (their q, k, v are qkv's output).
  const int64_t heads =
      tensor_parallel_.qkv.is_empty() ? options_.num_heads : tensor_parallel_.local_heads;
  const int64_t head_dim = options_.hidden_dim / options_.num_heads;
  at::Tensor qkv = dense(qkv_, tensor_parallel_.qkv, x);
  const int64_t tokens = qkv.size(1); // all of them: under sequence parallelism x holds some
  // [b, t, 3 * heads * head_dim] -> [3, b, heads, t, head_dim]
  qkv = qkv.reshape({batch, tokens, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});
  // softmax(q k^T / sqrt(head_dim)) v, with dropout on the weights while training, through
  // PyTorch's fused kernel (flash / memory-efficient attention on a GPU): the [t, t] weights
  // are never stored, which the explicit matmul-softmax-matmul did (slower on a GPU and
  // holding b * heads * t^2 floats for backward). Its dropout draws from the device
  // generator, so activation checkpointing replays it like any other dropout.
  const double dropout = is_training() ? options_.attention_dropout : 0.0;
  at::Tensor out = in_random_stream(dropout > 0.0, x, [&] {
    return at::scaled_dot_product_attention(
        qkv[0],
        qkv[1],
        qkv[2],
        /*attn_mask=*/{},
        dropout); // [b, heads, t, head_dim]
  });
  out = out.transpose(1, 2).reshape({batch, tokens, heads * head_dim}); // [b, t, d (or d/T)]
  return residual_dropout(dense(proj_, tensor_parallel_.proj, out));
}

at::Tensor VitEncoderLayerImpl::residual_dropout(const at::Tensor& x) {
  // Under sequence parallelism x is this rank's tokens; else every rank's x is the same.
  return in_random_stream(sequence_parallel() && is_training() && options_.dropout > 0.0, x, [&] {
    return at::dropout(x, options_.dropout, is_training());
  });
}

at::Tensor VitEncoderLayerImpl::drop_path(at::Tensor branch) {
  if (!is_training() || options_.drop_path == 0.0) {
    return branch;
  }
  // Drop the whole residual branch per sample; scale the kept ones to keep the mean. The
  // mask is per sample, so every rank draws it alike, whichever tokens it holds.
  const double keep = 1.0 - options_.drop_path;
  at::Tensor mask = at::empty({branch.size(0), 1, 1}, branch.options()).bernoulli_(keep);
  return branch * mask.div_(keep);
}

bool VitEncoderLayerImpl::fuses(const at::Tensor& x) const {
  switch (options_.fused_kernels) {
  case VitFusedKernels::kNever:
    return false;
  case VitFusedKernels::kOnCuda:
    return x.is_cuda();
  case VitFusedKernels::kEverywhere:
    return true;
  }
  return false;
}

std::pair<at::Tensor, at::Tensor>
VitEncoderLayerImpl::add_norm2(const at::Tensor& x, const at::Tensor& branch) {
  if (!fuses(x)) {
    at::Tensor sum = x + branch;
    at::Tensor normed = norm(norm2_, sum);
    return {std::move(sum), std::move(normed)};
  }
  // branch + x is x + branch bit for bit (one IEEE addition; ATen promotes alike either way).
  kernels::AddLayerNormOutput fused = kernels::add_layer_norm(
      branch,
      x,
      norm_parameter(norm2_->weight),
      norm_parameter(norm2_->bias),
      norm2_->options.eps());
  return {std::move(fused.sum), std::move(fused.output)};
}

at::Tensor VitEncoderLayerImpl::fc1_gelu(const at::Tensor& x) {
  const bool tensor_parallel = !tensor_parallel_.fc1.is_empty();
  if (!fuses(x) || (tensor_parallel && !tensor_parallel_.fc1_without_bias)) {
    return at::gelu(dense(fc1_, tensor_parallel_.fc1, x));
  }
  // The matmul alone (autocast casts it as it casts the whole linear), then bias + GELU.
  if (tensor_parallel) {
    return kernels::bias_gelu(tensor_parallel_.fc1_without_bias(x), tensor_parallel_.fc1_bias());
  }
  return kernels::bias_gelu(at::linear(x, fc1_->weight), fc1_->bias);
}

at::Tensor VitEncoderLayerImpl::forward(at::Tensor x) {
  const SequenceParallelHooks& sequence = tensor_parallel_.sequence;
  if (sequence.scatter_input) {
    x = sequence.scatter_input(x); // [b, t, d] -> this rank's tokens
  }
  auto [stream, normed] = add_norm2(x, drop_path(attention(norm(norm1_, x))));
  at::Tensor hidden = fc1_gelu(normed); // [b, t, mlp_dim] (or this rank's mlp_dim / T)
  const bool hidden_dropout = is_training() && options_.dropout > 0.0;
  hidden = in_random_stream(
      hidden_dropout, hidden, [&] { return at::dropout(hidden, options_.dropout, is_training()); });
  hidden = residual_dropout(dense(fc2_, tensor_parallel_.fc2, hidden)); // [b, t, d]
  x = stream + drop_path(hidden);
  return sequence.gather_output ? sequence.gather_output(x) : x;
}

VitFinalNormImpl::VitFinalNormImpl(int64_t hidden_dim, bool class_token)
    : class_token_(class_token) {
  norm_ = register_module("norm", layer_norm(hidden_dim));
}

at::Tensor VitFinalNormImpl::forward(at::Tensor x) {
  x = norm_(x);                                     // [b, t, d]
  return class_token_ ? x.select(1, 0) : x.mean(1); // [b, d]
}

Trunk build_vit_trunk(const VitOptions& options, int64_t in_channels, int64_t image_size) {
  const int64_t size = validate_vit(options, in_channels, image_size);
  const bool class_token = has_class_token(options);
  torch::nn::Sequential blocks;
  blocks->push_back(VitPatchEmbedding(
      in_channels, size, options.patch_size, options.hidden_dim, options.dropout, class_token));
  for (int64_t layer = 0; layer < options.num_layers; ++layer) {
    VitEncoderLayerOptions layer_options;
    layer_options.hidden_dim = options.hidden_dim;
    layer_options.num_heads = options.num_heads;
    layer_options.mlp_dim = options.mlp_dim;
    layer_options.dropout = options.dropout;
    layer_options.attention_dropout = options.attention_dropout;
    layer_options.qkv_bias = options.qkv_bias;
    layer_options.fused_kernels = options.fused_kernels;
    // Linear in depth, like VISSL: 0 for the first layer, drop_path_rate for the last.
    layer_options.drop_path = options.num_layers == 1
                                  ? options.drop_path_rate
                                  : options.drop_path_rate * static_cast<double>(layer) /
                                        static_cast<double>(options.num_layers - 1);
    blocks->push_back(VitEncoderLayer(layer_options));
  }
  blocks->push_back(VitFinalNorm(options.hidden_dim, class_token));
  return Trunk{blocks, options.hidden_dim};
}

} // namespace largo::models
