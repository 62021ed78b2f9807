// A Vision Transformer trunk (ViT, Dosovitskiy et al.), pre-LayerNorm, as VISSL's
// vision_transformer builds it from MODEL.TRUNK.VISION_TRANSFORMERS.
//
// Trunk blocks:
//   block 0        patch embedding: conv (kernel = stride = patch) -> tokens [b, n, d],
//                  prepend the class token ("token" classifier), add positional
//                  embedding, dropout                                  -> [b, n(+1), d]
//   blocks 1..L    encoder layers: x += drop_path(attn(norm1(x))); x += drop_path(mlp(norm2(x)))
//                  attn: qkv Linear, scaled dot product per head, proj Linear
//                  mlp: Linear(d -> mlp_dim), GELU, dropout, Linear(mlp_dim -> d), dropout
//   block L+1      final LayerNorm, then the class token (or the mean of all tokens) -> [b, d]
// Parameters: patch conv C*p*p*d + d; class token d; positions (n+1)*d; per layer
// 4d (two LayerNorms) + 3d*d (+3d with qkv_bias) + d*d + d + 2*d*mlp_dim + mlp_dim + d;
// final LayerNorm 2d.
// Init like VISSL/timm: Linear weights truncated normal (std 0.02), biases 0, LayerNorm 1/0,
// class token and positions truncated normal (std 0.02), the patch conv as torch.nn.Conv2d.
#pragma once

#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace largo::models {

// Where an encoder layer calls largo::kernels' fused ops in place of ATen's: bias_gelu for
// gelu(fc1(x)) (fc1's matmul without its bias, then the bias and the GELU in one pass;
// kernels/bias_gelu.h) and add_layer_norm for the attention branch's residual add and norm2
// (kernels/add_layer_norm.h). Same function, other rounding: the bias is added after the matmul
// is rounded, not inside it, and the fused reductions run in another order. The MLP's residual
// add and the next layer's norm1 stay ATen's (they are in two modules, which pipelines and
// activation checkpointing cut between). Under tensor parallelism both fuse too (fc1 is then
// a column-parallel module: TensorParallelLinears::fc1_without_bias gives its product).
enum class VitFusedKernels {
  kNever,      // ATen's linear + GELU and add + LayerNorm everywhere
  kOnCuda,     // on CUDA activations, where the kernels fuse (the default)
  kEverywhere, // also off CUDA, where the two calls run ATen's unfused sequence: what the
               // fused path computes, checkable where no GPU is (tests/models/vit_fused_test.cpp)
};

// Keys are MODEL.TRUNK.VISION_TRANSFORMERS.<NAME>; the defaults are ViT-B/16's (VISSL's).
struct VitOptions {
  // IMAGE_SIZE: side of the square input; 0 = take it from the data. When set, it must
  // equal the input images' size (the positional embedding is sized from it).
  int64_t image_size = 0;
  int64_t patch_size = 16;        // PATCH_SIZE: must divide image_size
  int64_t num_layers = 12;        // NUM_LAYERS
  int64_t num_heads = 12;         // NUM_HEADS: must divide hidden_dim
  int64_t hidden_dim = 768;       // HIDDEN_DIM
  int64_t mlp_dim = 3072;         // MLP_DIM
  double dropout = 0.0;           // DROPOUT_RATE: embeddings, attention output and MLP
  double attention_dropout = 0.0; // ATTENTION_DROPOUT_RATE: on the attention weights
  // DROP_PATH_RATE: stochastic depth, rising linearly from 0 (first layer) to this (last).
  double drop_path_rate = 0.0;
  bool qkv_bias = false;            // QKV_BIAS
  std::string classifier = "token"; // CLASSIFIER: "token" (class token) or "gap" (mean)
  // USE_CLASS_TOKEN: VISSL's switch (it ignores CLASSIFIER). False is "gap": no class token,
  // the output is the mean of the tokens after the final norm (VISSL's FeatAvgPool).
  bool use_class_token = true;
  // Where each encoder layer runs its fc1 bias + GELU and its attention residual add + norm2
  // through largo::kernels' fused ops (MODEL.FUSED_KERNELS: True kOnCuda, False kNever).
  VitFusedKernels fused_kernels = VitFusedKernels::kOnCuda;
};

// Whether the trunk has a class token: use_class_token and the "token" classifier.
inline bool has_class_token(const VitOptions& options) {
  return options.use_class_token && options.classifier == "token";
}

// Validates (OptionError naming the VitOptions field, value and what is expected) and builds the
// trunk. image_size: side of the input images (used when options.image_size is 0).
Trunk build_vit_trunk(const VitOptions& options, int64_t in_channels, int64_t image_size);

// Fills `tensor` with a normal(0, std) truncated to [-2, 2] (absolute bounds, as VISSL's and
// timm's trunc_normal_ default to; inverse-CDF method, the same draws as theirs).
void trunc_normal_(at::Tensor tensor, double std);

// [b, c, h, w] -> [b, n(+1), d]
class VitPatchEmbeddingImpl : public torch::nn::Module {
 public:
  VitPatchEmbeddingImpl(
      int64_t in_channels,
      int64_t image_size,
      int64_t patch_size,
      int64_t hidden_dim,
      double dropout,
      bool class_token);
  at::Tensor forward(at::Tensor x);
  // n(+1): the tokens of the output sequence of an input of the size built for (inputs of
  // other sizes, with a class token, give their own count: vit_position_interpolation.h).
  int64_t num_tokens() const {
    return pos_embedding_.size(1);
  }
  // Whether token 0 is the class token ("token" classifier; "gap" has none).
  bool has_class_token() const {
    return class_token_.defined();
  }

 private:
  // The input's patches per side; throws for inputs the embedding cannot take.
  int64_t input_grid(const at::Tensor& x) const;

  int64_t image_size_; // the side the positional embedding is built for
  int64_t patch_size_;
  double dropout_;
  torch::nn::Conv2d conv_proj_{nullptr};
  at::Tensor class_token_;   // [1, 1, d]; undefined for the "gap" classifier
  at::Tensor pos_embedding_; // [1, n(+1), d]
};
TORCH_MODULE(VitPatchEmbedding);

struct VitEncoderLayerOptions {
  int64_t hidden_dim = 768;
  int64_t num_heads = 12;
  int64_t mlp_dim = 3072;
  double dropout = 0.0;
  double attention_dropout = 0.0;
  double drop_path = 0.0;
  bool qkv_bias = false;
  VitFusedKernels fused_kernels = VitFusedKernels::kOnCuda;
};

// [b, t, d] -> [b, t, d]
class VitEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit VitEncoderLayerImpl(const VitEncoderLayerOptions& options);
  at::Tensor forward(at::Tensor x);
  const VitEncoderLayerOptions& options() const {
    return options_;
  }

  // Sequence parallelism's hooks (Korthikanti et al. 2022; parallel/tensor_parallel/tensor_parallel_plan.h):
  // set, the layer holds only this rank's tokens between its column- and row-parallel
  // layers, i.e. its input, norms, residual stream and output; the column-parallel qkv and
  // fc1 gather the tokens they need and the row-parallel proj and fc2 scatter theirs.
  struct SequenceParallelHooks {
    // The full sequence [b, t, d] -> this rank's tokens: set on the first layer of a run of
    // layers only (its input comes from the patch embedding).
    std::function<at::Tensor(const at::Tensor&)> scatter_input;
    // This rank's tokens -> the full sequence: set on the last layer of a run only (the final
    // norm and the head take every token).
    std::function<at::Tensor(const at::Tensor&)> gather_output;
    // A replicated parameter applied to this rank's tokens only (the norms' weights and
    // biases), as the identity whose gradient is summed over the ranks: each rank's covers
    // its tokens.
    std::function<at::Tensor(const at::Tensor&)> sum_gradient_over_shards;
  };

  // The hook of tensor parallelism (parallel/tensor_parallel/tensor_parallel_plan.h), which builds these from
  // the layer's own qkv, proj, fc1 and fc2 (registered under those names): `qkv` maps
  // [b, t, d] to the q, k and v of this rank's `local_heads` heads, [b, t, 3 * local_heads *
  // head_dim] in the layout qkv has for all heads; `proj` takes this rank's heads' outputs,
  // [b, t, local_heads * head_dim], to the full [b, t, d]; `fc1` maps [b, t, d] to this rank's
  // share of the hidden features and `fc2` that share to the full [b, t, d] (under sequence
  // parallelism qkv and fc1 take, and proj and fc2 give, this rank's tokens of [b, t, d]).
  // The models layer knows no process groups, hence modules of any type and functions.
  struct TensorParallelLinears {
    torch::nn::AnyModule qkv, proj, fc1, fc2;
    int64_t local_heads = 0;
    // This rank's index among the layer's shards: dropout on what only this rank holds (its
    // heads' attention weights, its share of the hidden features; under sequence parallelism
    // its tokens) draws from random stream shard_index (core/shard_random_stream.h).
    int64_t shard_index = 0;
    SequenceParallelHooks sequence; // empty functions: every rank holds every token
    // fc1's product without its bias (this rank's share of the hidden features), and that
    // share of the bias: the fused path adds it with the GELU (kernels::bias_gelu). Empty: fc1
    // runs whole (fc1.forward) and the GELU after it, ATen's ops.
    std::function<at::Tensor(const at::Tensor&)> fc1_without_bias;
    std::function<at::Tensor()> fc1_bias;
  };
  // Replaces the four Linear children by those (same names, so parameter names stay) and
  // runs attention on local_heads heads from then on.
  void use_tensor_parallel_linears(TensorParallelLinears linears);

 private:
  at::Tensor attention(const at::Tensor& x); // [b, t, d] -> [b, t, d]
  at::Tensor drop_path(at::Tensor branch);   // per-sample stochastic depth in training
  // Dropout on a branch's output before the residual sum (proj's, fc2's).
  at::Tensor residual_dropout(const at::Tensor& x);
  // `full` on x, or its tensor-parallel replacement once there is one.
  at::Tensor
  dense(const torch::nn::Linear& full, torch::nn::AnyModule& parallel, const at::Tensor& x);
  // norm(x), its weight and bias summed over the shards under sequence parallelism.
  at::Tensor norm(torch::nn::LayerNorm& layer, const at::Tensor& x);
  // A norm's weight or bias as this layer applies it: summed over the shards in backward
  // under sequence parallelism, else itself.
  at::Tensor norm_parameter(const at::Tensor& parameter);
  // Whether this call on x runs the fused ops (VitEncoderLayerOptions::fused_kernels).
  bool fuses(const at::Tensor& x) const;
  // x + branch (the residual stream) and norm2 of it: {sum, normed}.
  std::pair<at::Tensor, at::Tensor> add_norm2(const at::Tensor& x, const at::Tensor& branch);
  // gelu(fc1(x)): [b, t, d] -> [b, t, mlp_dim] (or this rank's share).
  at::Tensor fc1_gelu(const at::Tensor& x);
  // `region` (dropout) in this rank's own random stream when what it draws for is this
  // rank's alone (`sharded`) under tensor parallelism; else in the stream every rank shares.
  at::Tensor
  in_random_stream(bool sharded, const at::Tensor& x, const std::function<at::Tensor()>& region);
  bool sequence_parallel() const {
    return static_cast<bool>(tensor_parallel_.sequence.sum_gradient_over_shards);
  }

  VitEncoderLayerOptions options_;
  torch::nn::LayerNorm norm1_{nullptr};
  torch::nn::Linear qkv_{nullptr}; // d -> 3d: queries, keys, values of every head
  torch::nn::Linear proj_{nullptr};
  torch::nn::LayerNorm norm2_{nullptr};
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
  TensorParallelLinears tensor_parallel_; // empty modules unless tensor-parallel
};
TORCH_MODULE(VitEncoderLayer);

// [b, t, d] -> LayerNorm -> class token (t index 0) or mean over t -> [b, d]
class VitFinalNormImpl : public torch::nn::Module {
 public:
  VitFinalNormImpl(int64_t hidden_dim, bool class_token);
  at::Tensor forward(at::Tensor x);
  // The LayerNorm alone, [b, t, d] -> [b, t, d]: VISSL's linear evaluation applies it to every
  // layer's tokens (models/feature_taps.h).
  at::Tensor norm_tokens(const at::Tensor& x) {
    return norm_(x);
  }

 private:
  torch::nn::LayerNorm norm_{nullptr};
  bool class_token_;
};
TORCH_MODULE(VitFinalNorm);

} // namespace largo::models
