#include <largo/models/channels_last_module.h>

#include <largo/core/channels_last.h>

#include <torch/torch.h>

namespace largo::models {

int64_t convert_to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  int64_t converted = 0;
  auto convert = [&](at::Tensor& tensor) {
    if (tensor.dim() == 4 && !has_channels_last_strides(tensor)) {
      tensor.set_data(to_channels_last(tensor));
      ++converted;
    }
  };
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    convert(item.value());
  }
  for (auto& item : module.named_buffers(/*recurse=*/true)) {
    convert(item.value());
  }
  return converted;
}

bool has_convolution_weights(const torch::nn::Module& module) {
  for (const auto& param : module.parameters(/*recurse=*/true)) {
    if (param.dim() == 4) {
      return true;
    }
  }
  return false;
}

} // namespace largo::models
