// The channels-last memory layout (NHWC strides for an [N, C, H, W] tensor), which cuDNN and
// oneDNN run convolutions fastest in (docs/performance.md, "Channels-last").
#pragma once

#include <ATen/ATen.h>

namespace largo {

// Whether `tensor` is 4-D with exactly channels-last strides: those at::empty gives for
// MemoryFormat::ChannelsLast. (ATen's is_contiguous(ChannelsLast) also answers true for NCHW
// strides where a dimension of size 1 makes them ambiguous, e.g. a 1x1 kernel or one input
// channel, and its convolutions then run NCHW.)
bool has_channels_last_strides(const at::Tensor& tensor);

// `tensor` (4-D) copied into channels-last strides, in page-locked host memory when `pinned`
// (a CPU tensor bound for a CUDA device); itself when it has them already and need not move.
at::Tensor to_channels_last(const at::Tensor& tensor, bool pinned = false);

} // namespace largo
