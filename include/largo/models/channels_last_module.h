// A module's convolution weights in the channels-last layout (core/channels_last.h), what
// PyTorch's module.to(memory_format=torch.channels_last) does: every 4-D parameter and buffer
// gets NHWC strides in place, so that its convolutions (cuDNN, oneDNN) run channels-last and
// return channels-last activations whatever the input's layout. Gradients and the optimizer
// state that zeros_like makes follow the parameters' strides. Values are unchanged; the
// checkpoint writer saves the standard (contiguous) layout (ParallelModel::model_state_dict).
#pragma once

#include <torch/nn/module.h>

namespace largo::models {

// Converts in place (Tensor::set_data: the module keeps its tensor objects, so call it before
// an optimizer or a parallel wrapper holds views of them). Returns how many tensors changed.
int64_t convert_to_channels_last(torch::nn::Module& module);

// Whether `module` has a 4-D parameter (a convolution): the layout matters to it.
bool has_convolution_weights(const torch::nn::Module& module);

} // namespace largo::models
