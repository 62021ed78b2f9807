#include <largo/precision/model_cast.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/torch.h>

namespace largo::precision {

bool is_batchnorm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) != nullptr ||
      dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr ||
      dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr;
}

void cast_model(torch::nn::Module& model, const ModelCastOptions& options) {
  torch::NoGradGuard no_grad;
  const auto& keep_fp32 = options.is_batchnorm ? options.is_batchnorm : is_batchnorm;
  auto cast = [&](at::Tensor& tensor) {
    if (tensor.defined() && tensor.is_floating_point() &&
        tensor.scalar_type() != options.dtype) {
      tensor.set_data(tensor.to(options.dtype));
    }
  };
  for (const auto& module : model.modules(/*include_self=*/true)) {
    if (options.keep_batchnorm_fp32 && keep_fp32(*module)) {
      continue;
    }
    for (auto& item : module->named_parameters(/*recurse=*/false)) {
      cast(item.value());
    }
    for (auto& item : module->named_buffers(/*recurse=*/false)) {
      cast(item.value());
    }
  }
}

} // namespace largo::precision
