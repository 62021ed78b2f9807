#include <largo/kernels/batch_norm_relu.h>

#include <largo/core/channels_last.h>

#include <torch/csrc/autograd/custom_function.h>

#ifdef LARGO_WITH_CUDA_KERNELS
#include "batch_norm_relu_cuda.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace largo::kernels {
namespace {

// One call's arguments, as at::batch_norm's; `residual` undefined for batch_norm_relu.
struct BatchNormCall {
  const char* function = "batch_norm_relu"; // for messages
  at::Tensor input;                         // [N, C, H, W]
  at::Tensor residual;                      // [N, C, H, W] or undefined
  at::Tensor weight;                        // [C]
  at::Tensor bias;                          // [C]
  at::Tensor running_mean;                  // [C] or undefined
  at::Tensor running_var;                   // [C] or undefined
  bool training = true;
  double momentum = 0.1;
  double eps = 1e-5;
};

// What ATen's BatchNorm refuses too, said before either path runs, naming the argument.
void check_arguments(const BatchNormCall& call) {
  const char* function = call.function;
  const at::Tensor& input = call.input;
  TORCH_CHECK(input.defined(), function, ": input is undefined");
  TORCH_CHECK(
      input.dim() == 4, function, ": input must be 4-D [N, C, H, W], got sizes ", input.sizes());
  const int64_t channels = input.size(1);
  const auto check_per_channel = [&](const at::Tensor& tensor, const char* name) {
    TORCH_CHECK(
        !tensor.defined() || (tensor.dim() == 1 && tensor.size(0) == channels),
        function,
        ": ",
        name,
        " must be [C] = [",
        channels,
        "] for input sizes ",
        input.sizes(),
        ", got sizes ",
        tensor.sizes());
  };
  check_per_channel(call.weight, "weight");
  check_per_channel(call.bias, "bias");
  check_per_channel(call.running_mean, "running_mean");
  check_per_channel(call.running_var, "running_var");
  const bool has_mean = call.running_mean.defined();
  const bool has_var = call.running_var.defined();
  TORCH_CHECK(
      has_mean == has_var,
      function,
      ": running_mean and running_var must be both defined or both undefined, got running_mean ",
      has_mean ? "defined" : "undefined",
      " and running_var ",
      has_var ? "defined" : "undefined");
  TORCH_CHECK(
      call.training || has_mean,
      function,
      ": training = false normalises with running_mean and running_var, which are undefined");
  TORCH_CHECK(
      !call.training || input.size(0) * input.size(2) * input.size(3) > 1,
      function,
      ": training = true needs more than 1 value per channel (N * H * W > 1), got input sizes ",
      input.sizes());
  if (call.residual.defined()) {
    TORCH_CHECK(
        call.residual.sizes() == input.sizes(),
        function,
        ": residual must have input's sizes ",
        input.sizes(),
        ", got ",
        call.residual.sizes());
    TORCH_CHECK(
        call.residual.device() == input.device(),
        function,
        ": residual must be on input's device ",
        input.device(),
        ", got ",
        call.residual.device());
  }
}

bool fused_applies(const BatchNormCall& call) {
  return uses_fused_batch_norm(
      call.input, call.residual, call.weight, call.bias, call.running_mean, call.running_var);
}

// The trunks' unfused sequence, exactly as they ran it (models/resnet.cpp): ATen's BatchNorm,
// the residual added in place, ReLU in place.
at::Tensor unfused_batch_norm_relu(const BatchNormCall& call) {
  at::Tensor output = at::batch_norm(
      call.input,
      call.weight,
      call.bias,
      call.running_mean,
      call.running_var,
      call.training,
      call.momentum,
      call.eps,
      at::globalContext().userEnabledCuDNN());
  if (call.residual.defined()) {
    output += call.residual;
  }
  return output.relu_();
}

#ifdef LARGO_WITH_CUDA_KERNELS

cuda::Activations activations_of(const at::Tensor& input) {
  cuda::Activations activations;
  activations.rows = input.size(0) * input.size(2) * input.size(3);
  activations.channels = input.size(1);
  switch (input.scalar_type()) {
  case at::kBFloat16:
    activations.type = cuda::ElementType::kBFloat16;
    break;
  case at::kHalf:
    activations.type = cuda::ElementType::kFloat16;
    break;
  default:
    TORCH_INTERNAL_ASSERT(input.scalar_type() == at::kFloat);
    activations.type = cuda::ElementType::kFloat32;
  }
  activations.device = input.get_device();
  activations.stream = c10::cuda::getCurrentCUDAStream(input.get_device()).stream();
  return activations;
}

float* float_data(const at::Tensor& tensor) {
  return tensor.defined() ? tensor.data_ptr<float>() : nullptr;
}

FusedBatchNormReluForward run_fused_forward(const BatchNormCall& call) {
  const c10::cuda::CUDAGuard device_guard(call.input.device());
  const cuda::Activations activations = activations_of(call.input);
  const at::TensorOptions statistics_options = call.weight.options();
  FusedBatchNormReluForward result;
  result.output = at::empty_like(call.input); // keeps input's channels-last strides
  result.save_mean = at::empty({activations.channels}, statistics_options);
  result.save_invstd = at::empty({activations.channels}, statistics_options);
  cuda::ForwardArguments args;
  args.input = call.input.data_ptr();
  args.residual = call.residual.defined() ? call.residual.data_ptr() : nullptr;
  args.weight = call.weight.data_ptr<float>();
  args.bias = call.bias.data_ptr<float>();
  args.running_mean = float_data(call.running_mean);
  args.running_var = float_data(call.running_var);
  args.training = call.training;
  args.momentum = static_cast<float>(call.momentum);
  args.eps = static_cast<float>(call.eps);
  at::Tensor workspace;
  if (call.training) {
    args.reduction = cuda::plan_reduction(activations);
    workspace =
        at::empty({args.reduction.workspace_floats(activations.channels)}, statistics_options);
    args.workspace = workspace.data_ptr<float>();
  }
  args.save_mean = result.save_mean.data_ptr<float>();
  args.save_invstd = result.save_invstd.data_ptr<float>();
  args.output = result.output.data_ptr();
  const char* error = cuda::batch_norm_relu_forward(activations, args);
  TORCH_CHECK(error == nullptr, call.function, ": the fused CUDA forward failed: ", error);
  return result;
}

// The fused kernels as an autograd function. apply(input, residual or undefined, weight, bias,
// call): the tensors it differentiates come on their own (autograd tracks only tensor
// arguments), `call` holds them and the rest. Saves input, output, weight and the statistics
// it normalised with.
class FusedBatchNormRelu : public torch::autograd::Function<FusedBatchNormRelu> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* context,
      const at::Tensor& input,
      const at::Tensor& residual,
      const at::Tensor& weight,
      const at::Tensor& bias,
      const BatchNormCall& call) {
    FusedBatchNormReluForward result = run_fused_forward(call);
    context->save_for_backward(
        {input, result.output, weight, result.save_mean, result.save_invstd});
    context->saved_data["training"] = call.training;
    context->saved_data["has_residual"] = residual.defined();
    return result.output;
  }

  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = context->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& output = saved[1];
    const at::Tensor& weight = saved[2];
    const at::Tensor& save_mean = saved[3];
    const at::Tensor& save_invstd = saved[4];
    const bool training = context->saved_data["training"].toBool();
    const bool has_residual = context->saved_data["has_residual"].toBool();
    const c10::cuda::CUDAGuard device_guard(input.device());
    // The kernels read the gradient as the output's [rows, channels] matrix; autograd may
    // hand another layout (an expanded scalar's, NCHW from a consumer that is not
    // channels-last).
    const at::Tensor grad_output = to_channels_last(grad_outputs[0]);
    const cuda::Activations activations = activations_of(input);
    at::Tensor grad_input = context->needs_input_grad(0) ? at::empty_like(input) : at::Tensor();
    at::Tensor grad_residual =
        has_residual && context->needs_input_grad(1) ? at::empty_like(input) : at::Tensor();
    at::Tensor grad_weight = at::empty({activations.channels}, weight.options());
    at::Tensor grad_bias = at::empty({activations.channels}, weight.options());
    cuda::BackwardArguments args;
    args.grad_output = grad_output.data_ptr();
    args.output = output.data_ptr();
    args.input = input.data_ptr();
    args.weight = weight.data_ptr<float>();
    args.save_mean = save_mean.data_ptr<float>();
    args.save_invstd = save_invstd.data_ptr<float>();
    args.training = training;
    args.reduction = cuda::plan_reduction(activations);
    const at::Tensor workspace =
        at::empty({args.reduction.workspace_floats(activations.channels)}, weight.options());
    args.workspace = workspace.data_ptr<float>();
    args.grad_weight = grad_weight.data_ptr<float>();
    args.grad_bias = grad_bias.data_ptr<float>();
    args.grad_input = grad_input.defined() ? grad_input.data_ptr() : nullptr;
    args.grad_residual = grad_residual.defined() ? grad_residual.data_ptr() : nullptr;
    const char* error = cuda::batch_norm_relu_backward(activations, args);
    TORCH_CHECK(error == nullptr, "batch_norm_relu: the fused CUDA backward failed: ", error);
    return {
        grad_input,
        grad_residual,
        context->needs_input_grad(2) ? grad_weight : at::Tensor(),
        context->needs_input_grad(3) ? grad_bias : at::Tensor(),
        at::Tensor()}; // call
  }
};

#endif // LARGO_WITH_CUDA_KERNELS

at::Tensor batch_norm_relu_any(const BatchNormCall& call) {
  check_arguments(call);
#ifdef LARGO_WITH_CUDA_KERNELS
  if (fused_applies(call)) {
    return FusedBatchNormRelu::apply(call.input, call.residual, call.weight, call.bias, call);
  }
#endif
  return unfused_batch_norm_relu(call);
}

} // namespace

at::Tensor batch_norm_relu(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    bool training,
    double momentum,
    double eps) {
  return batch_norm_relu_any(
      {"batch_norm_relu",
       input,
       at::Tensor(),
       weight,
       bias,
       running_mean,
       running_var,
       training,
       momentum,
       eps});
}

at::Tensor batch_norm_add_relu(
    const at::Tensor& input,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    bool training,
    double momentum,
    double eps) {
  TORCH_CHECK(residual.defined(), "batch_norm_add_relu: residual is undefined");
  return batch_norm_relu_any(
      {"batch_norm_add_relu",
       input,
       residual,
       weight,
       bias,
       running_mean,
       running_var,
       training,
       momentum,
       eps});
}

FusedBatchNormReluForward fused_batch_norm_relu_forward(
    const at::Tensor& input,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    bool training,
    double momentum,
    double eps) {
  const BatchNormCall call{
      "fused_batch_norm_relu_forward",
      input,
      residual,
      weight,
      bias,
      running_mean,
      running_var,
      training,
      momentum,
      eps};
  check_arguments(call);
  TORCH_CHECK(
      fused_applies(call),
      call.function,
      ": the fused kernels do not take these arguments (input ",
      input.sizes(),
      " ",
      input.scalar_type(),
      " on ",
      input.device(),
      ", channels-last strides: ",
      has_channels_last_strides(input) ? "yes" : "no",
      "; CUDA kernels compiled: ",
      cuda_kernels_compiled() ? "yes" : "no",
      "); batch_norm_relu.h lists what they take");
#ifdef LARGO_WITH_CUDA_KERNELS
  return run_fused_forward(call);
#else
  TORCH_INTERNAL_ASSERT(false, "unreachable: uses_fused_batch_norm is false without the kernels");
#endif
}

bool cuda_kernels_compiled() {
#ifdef LARGO_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

bool uses_fused_batch_norm(
    const at::Tensor& input,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var) {
  if (!cuda_kernels_compiled() || !input.defined() || !input.is_cuda() ||
      !has_channels_last_strides(input)) {
    return false;
  }
  const at::ScalarType type = input.scalar_type();
  if (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf) {
    return false;
  }
  const int64_t channels = input.size(1);
  if (channels == 0 || input.size(0) * input.size(2) * input.size(3) == 0) {
    return false;
  }
  const auto is_float_vector = [&](const at::Tensor& tensor) {
    return tensor.defined() && tensor.device() == input.device() &&
           tensor.scalar_type() == at::kFloat && tensor.dim() == 1 && tensor.size(0) == channels &&
           tensor.is_contiguous();
  };
  if (!is_float_vector(weight) || !is_float_vector(bias)) {
    return false;
  }
  if (running_mean.defined() || running_var.defined()) {
    if (!is_float_vector(running_mean) || !is_float_vector(running_var)) {
      return false;
    }
  }
  return !residual.defined() ||
         (residual.scalar_type() == type && residual.device() == input.device() &&
          residual.sizes() == input.sizes() && residual.strides() == input.strides());
}

} // namespace largo::kernels
