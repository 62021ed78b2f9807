// Model FLOPs: the arithmetic one training sample costs, counted analytically per layer from
// the model's options, for model FLOP utilisation (achieved FLOP/s against the machine's
// measured peak, bench/run_peak_bench.sh) and for the trainer's FLOP/s figure.
//
// What is counted (the usual "model FLOPs" convention, as in PaLM's MFU):
//   - forward: 2 FLOPs (a multiply and an add) per multiply-accumulate of every convolution,
//     Linear layer (trunk and head) and attention matmul (q k^T and weights v). The same
//     numbers torch.profiler's with_flops gives for aten::conv2d / addmm / mm / bmm.
//   - not counted: bias adds, normalisations, activations, softmax, pooling, residual adds,
//     dropout, the loss and the optimizer step. They are memory-bound and together a few
//     percent of the arithmetic (e.g. < 1 % of ResNet-50's).
//   - training = 3 x forward: the backward pass computes, per matmul/convolution, the
//     gradient of its input and of its weight, each as many FLOPs as the forward. Autograd
//     skips the input gradient of the first layer (the images need none), so the true count
//     is slightly lower; activation checkpointing recomputes forwards that are not counted
//     either (model FLOPs, not hardware FLOPs).
// Counts are per sample (one image) at the options' image size.
#pragma once

#include <largo/models/model_factory.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::models {

// Output side of a convolution or pooling window: floor((in + 2 padding - kernel) / stride) + 1.
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding);

struct Conv2dShape {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel = 1;     // square kernel side
  int64_t groups = 1;     // each output channel sees in_channels / groups inputs
  int64_t out_height = 0; // the output map
  int64_t out_width = 0;
};
// 2 * out_h * out_w * out_channels * (in_channels / groups) * kernel^2
int64_t conv2d_flops(const Conv2dShape& shape);
// 2 * rows * in_features * out_features (rows: the tokens of a sequence, 1 for an image)
int64_t linear_flops(int64_t in_features, int64_t out_features, int64_t rows = 1);
// Self-attention's two matmuls over all heads: q k^T ([t, d/h] x [d/h, t] per head) and
// weights v ([t, t] x [t, d/h] per head) = 2 * 2 * t^2 * d. The qkv and output projections
// are Linear layers, counted by linear_flops.
int64_t attention_flops(int64_t tokens, int64_t hidden_dim);

struct LayerFlops {
  std::string name;          // e.g. "trunk.3.conv2", "trunk.1.attention", "head.0"
  int64_t forward_flops = 0; // per sample
};

struct ModelFlops {
  std::vector<LayerFlops> layers; // forward, per sample, in execution order

  int64_t forward_per_sample() const;
  int64_t training_per_sample() const {
    return 3 * forward_per_sample();
  }
};

// Counts the model build_model(options) builds (trunk and head). Throws ConfigError like
// build_model for options it would reject.
ModelFlops count_model_flops(const ModelOptions& options);

// count_model_flops(options).training_per_sample(): what the trainer multiplies by its
// images per second to print achieved FLOP/s.
// With several views per image (options.view_shapes, a MultiCropModel): the sum over the
// views, each counted at its own size (SwAV's 2 x 224 + 6 x 96 crops cost 2 x 224's and 6 x
// 96's trunk and head); with options.moco view 1 counts its forward only (the momentum
// encoder's); with options.dino each of the teacher's crops adds a forward (the teacher's).
int64_t training_flops_per_sample(const ModelOptions& options);

// A training step of a linear evaluation (models/linear_eval.h, options.feature_eval enabled):
// the frozen trunk runs forward only, through its first `trunk_blocks_run` blocks
// (LinearEvalModel::trunk_blocks_run); the heads run forward and backward (3 x forward), or
// forward only when frozen too (FREEZE_TRUNK_AND_HEAD). The heads are the tapped features'
// Linear layers, or the pretrained head without taps.
int64_t
linear_eval_training_flops_per_sample(const ModelOptions& options, int64_t trunk_blocks_run);

// A FLOP count with an SI prefix and three significant digits, for the console:
// 11546112 -> "11.5 MFLOP", 7.11e10 -> "71.1 GFLOP" (append "/s" for a rate).
std::string format_flops(double flops);

} // namespace largo::models
