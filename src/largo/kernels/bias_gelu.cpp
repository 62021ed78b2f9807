#include <largo/kernels/bias_gelu.h>

#include <largo/kernels/batch_norm_relu.h> // cuda_kernels_compiled

#include <torch/csrc/autograd/custom_function.h>

#ifdef LARGO_WITH_CUDA_KERNELS
#include "transformer_fusions_cuda.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

// (Names in this file's anonymous namespace are unique across the layer: the unity build may
// compile it with batch_norm_relu.cpp and add_layer_norm.cpp as one unit.)
namespace largo::kernels {
namespace {

void check_bias_gelu_arguments(
    const at::Tensor& input, const at::Tensor& bias, std::string_view approximate) {
  TORCH_CHECK(input.defined(), "bias_gelu: input is undefined");
  TORCH_CHECK(bias.defined(), "bias_gelu: bias is undefined");
  TORCH_CHECK(input.dim() >= 1, "bias_gelu: input must be [..., N], got a 0-dimensional tensor");
  TORCH_CHECK(
      bias.dim() == 1 && bias.size(0) == input.size(-1),
      "bias_gelu: bias must be [N] = [",
      input.size(-1),
      "] for input sizes ",
      input.sizes(),
      ", got sizes ",
      bias.sizes());
  TORCH_CHECK(
      bias.device() == input.device(),
      "bias_gelu: bias must be on input's device ",
      input.device(),
      ", got ",
      bias.device());
  TORCH_CHECK(
      approximate == "none" || approximate == "tanh",
      "bias_gelu: approximate must be \"none\" or \"tanh\", got \"",
      approximate,
      "\"");
}

// The sequence the header promises: the bias in the input's dtype (a no-op when it has it),
// ATen's add, ATen's GELU.
at::Tensor
unfused_bias_gelu(const at::Tensor& input, const at::Tensor& bias, std::string_view approximate) {
  return at::gelu(input + bias.to(input.scalar_type()), approximate);
}

#ifdef LARGO_WITH_CUDA_KERNELS

cuda::Activations gelu_activations_of(const at::Tensor& input) {
  cuda::Activations activations;
  activations.channels = input.size(-1);
  activations.rows = input.numel() / activations.channels;
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

// The fused kernels as an autograd function: apply(input, bias, use_tanh).
//
// What backward needs is gelu'(input + bias). It keeps `input` and recomputes the sum, rather
// than having the forward write the pre-activation: `input` (the matmul's output) exists
// anyway and the add costs nothing in an element-wise pass, so the forward moves 2 passes of
// activation-sized memory (read input, write y) instead of 3, backward 3 either way (read
// grad and input, or grad and the pre-activation; write grad_input), and the memory held
// until backward is one tensor of input's size in both cases.
class FusedBiasGelu : public torch::autograd::Function<FusedBiasGelu> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* context,
      const at::Tensor& input,
      const at::Tensor& bias,
      bool use_tanh) {
    const c10::cuda::CUDAGuard device_guard(input.device());
    // The bias as the input's dtype rounds it, widened back exactly: the kernels' float32.
    const at::Tensor kernel_bias = bias.to(input.scalar_type()).to(at::kFloat).contiguous();
    at::Tensor output = at::empty_like(input, at::MemoryFormat::Contiguous);
    cuda::BiasGeluForwardArguments args;
    args.input = input.data_ptr();
    args.bias = kernel_bias.data_ptr<float>();
    args.approximation = use_tanh ? cuda::GeluApproximation::kTanh : cuda::GeluApproximation::kNone;
    args.output = output.data_ptr();
    const char* error = cuda::bias_gelu_forward(gelu_activations_of(input), args);
    TORCH_CHECK(error == nullptr, "bias_gelu: the fused CUDA forward failed: ", error);
    context->save_for_backward({input, kernel_bias});
    context->saved_data["tanh"] = use_tanh;
    context->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    return output;
  }

  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list grad_outputs) {
    const bool input_grad = context->needs_input_grad(0);
    const bool bias_grad = context->needs_input_grad(1);
    if (!input_grad && !bias_grad) {
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const torch::autograd::variable_list saved = context->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& kernel_bias = saved[1];
    const c10::cuda::CUDAGuard device_guard(input.device());
    // The kernels read the gradient as a row-major matrix; autograd may hand another layout
    // (an expanded scalar's from a sum, a transpose's).
    const at::Tensor grad_output = grad_outputs[0].contiguous();
    const cuda::Activations activations = gelu_activations_of(input);
    cuda::BiasGeluBackwardArguments args;
    args.grad_output = grad_output.data_ptr();
    args.input = input.data_ptr();
    args.bias = kernel_bias.data_ptr<float>();
    args.approximation = context->saved_data["tanh"].toBool() ? cuda::GeluApproximation::kTanh
                                                              : cuda::GeluApproximation::kNone;
    args.reduction = cuda::plan_reduction(activations);
    const at::Tensor workspace =
        at::empty({args.reduction.workspace_floats(activations.channels)}, kernel_bias.options());
    args.workspace = workspace.data_ptr<float>();
    const at::Tensor grad_input =
        input_grad ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor();
    const at::Tensor grad_bias =
        bias_grad ? at::empty({activations.channels}, kernel_bias.options()) : at::Tensor();
    args.grad_input = input_grad ? grad_input.data_ptr() : nullptr;
    args.grad_bias = bias_grad ? grad_bias.data_ptr<float>() : nullptr;
    const char* error = cuda::bias_gelu_backward(activations, args);
    TORCH_CHECK(error == nullptr, "bias_gelu: the fused CUDA backward failed: ", error);
    const auto bias_dtype = static_cast<at::ScalarType>(context->saved_data["bias_dtype"].toInt());
    return {grad_input, bias_grad ? grad_bias.to(bias_dtype) : at::Tensor(), at::Tensor()};
  }
};

#endif // LARGO_WITH_CUDA_KERNELS

} // namespace

at::Tensor
bias_gelu(const at::Tensor& input, const at::Tensor& bias, std::string_view approximate) {
  check_bias_gelu_arguments(input, bias, approximate);
#ifdef LARGO_WITH_CUDA_KERNELS
  if (uses_fused_bias_gelu(input, bias)) {
    return FusedBiasGelu::apply(input, bias, approximate == "tanh");
  }
#endif
  return unfused_bias_gelu(input, bias, approximate);
}

bool uses_fused_bias_gelu(const at::Tensor& input, const at::Tensor& bias) {
  if (!cuda_kernels_compiled() || !input.defined() || !input.is_cuda() || input.dim() < 1 ||
      input.numel() == 0 || !input.is_contiguous()) {
    return false;
  }
  const at::ScalarType type = input.scalar_type();
  if (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf) {
    return false;
  }
  return bias.defined() && bias.device() == input.device() && bias.dim() == 1 &&
         bias.size(0) == input.size(-1) && bias.is_contiguous() &&
         (bias.scalar_type() == at::kFloat || bias.scalar_type() == type);
}

} // namespace largo::kernels
