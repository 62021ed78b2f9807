#include <largo/kernels/add_layer_norm.h>

#include <largo/kernels/batch_norm_relu.h> // cuda_kernels_compiled

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef LARGO_WITH_CUDA_KERNELS
#include "transformer_fusions_cuda.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

// (Names in this file's anonymous namespace are unique across the layer: the unity build may
// compile it with batch_norm_relu.cpp and bias_gelu.cpp as one unit.)
namespace largo::kernels {
namespace {

void check_add_layer_norm_arguments(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias) {
  TORCH_CHECK(x.defined(), "add_layer_norm: x is undefined");
  TORCH_CHECK(residual.defined(), "add_layer_norm: residual is undefined");
  TORCH_CHECK(x.dim() >= 1, "add_layer_norm: x must be [..., D], got a 0-dimensional tensor");
  TORCH_CHECK(
      residual.sizes() == x.sizes(),
      "add_layer_norm: residual must have x's sizes ",
      x.sizes(),
      ", got ",
      residual.sizes());
  TORCH_CHECK(
      residual.device() == x.device(),
      "add_layer_norm: residual must be on x's device ",
      x.device(),
      ", got ",
      residual.device());
  const int64_t features = x.size(-1);
  for (const auto& [tensor, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!tensor->defined()) {
      continue;
    }
    TORCH_CHECK(
        tensor->dim() == 1 && tensor->size(0) == features,
        "add_layer_norm: ",
        name,
        " must be [D] = [",
        features,
        "] for x sizes ",
        x.sizes(),
        ", got sizes ",
        tensor->sizes());
    TORCH_CHECK(
        tensor->device() == x.device(),
        "add_layer_norm: ",
        name,
        " must be on x's device ",
        x.device(),
        ", got ",
        tensor->device());
  }
}

// The sequence the header promises, through the dispatcher (so autocast applies as it would).
AddLayerNormOutput unfused_add_layer_norm(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    double eps) {
  AddLayerNormOutput result;
  result.sum = x + residual;
  result.output = at::layer_norm(result.sum, {x.size(-1)}, weight, bias, eps);
  return result;
}

bool is_kernel_dtype(at::ScalarType type) {
  return type == at::kFloat || type == at::kBFloat16 || type == at::kHalf;
}

// The dtype of at::layer_norm(sum)'s result: float32 under CUDA autocast (its float32 list),
// else the sum's.
at::ScalarType layer_norm_output_dtype(at::ScalarType sum_dtype, bool cuda) {
  return cuda && at::autocast::is_autocast_enabled(at::kCUDA) ? at::kFloat : sum_dtype;
}

#ifdef LARGO_WITH_CUDA_KERNELS

cuda::ElementType layer_norm_element_type(at::ScalarType type) {
  switch (type) {
  case at::kBFloat16:
    return cuda::ElementType::kBFloat16;
  case at::kHalf:
    return cuda::ElementType::kFloat16;
  default:
    TORCH_INTERNAL_ASSERT(type == at::kFloat);
    return cuda::ElementType::kFloat32;
  }
}

// The row-major [rows, D] view of `sum` for the launchers (type: the sum's).
cuda::Activations layer_norm_activations_of(const at::Tensor& sum) {
  cuda::Activations activations;
  activations.channels = sum.size(-1);
  activations.rows = sum.numel() / activations.channels;
  activations.type = layer_norm_element_type(sum.scalar_type());
  activations.device = sum.get_device();
  activations.stream = c10::cuda::getCurrentCUDAStream(sum.get_device()).stream();
  return activations;
}

// Every dtype of a call: x, residual, weight, bias, and the sum and output it makes.
struct AddLayerNormDtypes {
  at::ScalarType x;
  at::ScalarType residual;
  at::ScalarType weight;
  at::ScalarType bias;
  at::ScalarType sum;
  at::ScalarType output;
  cuda::AddLayerNormTypes kernel_types() const {
    return {
        layer_norm_element_type(x),
        layer_norm_element_type(residual),
        layer_norm_element_type(sum),
        layer_norm_element_type(output)};
  }
};

// The fused kernels as an autograd function: apply(x, residual, weight, bias, eps,
// output_dtype) -> {sum, output}. Saves sum, the parameters widened to float32, and the rows'
// mean and rstd; backward runs with undefined gradients left undefined (materialize_grads off),
// so that a sum nobody differentiates costs no read of zeros.
class FusedAddLayerNorm : public torch::autograd::Function<FusedAddLayerNorm> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* context,
      const at::Tensor& x,
      const at::Tensor& residual,
      const at::Tensor& weight,
      const at::Tensor& bias,
      double eps,
      at::ScalarType output_dtype) {
    const c10::cuda::CUDAGuard device_guard(x.device());
    const AddLayerNormDtypes dtypes{
        x.scalar_type(),
        residual.scalar_type(),
        weight.scalar_type(),
        bias.scalar_type(),
        at::promote_types(x.scalar_type(), residual.scalar_type()),
        output_dtype};
    const at::Tensor kernel_weight = weight.to(at::kFloat).contiguous(); // exact widening
    const at::Tensor kernel_bias = bias.to(at::kFloat).contiguous();
    const at::Tensor sum = at::empty(x.sizes(), x.options().dtype(dtypes.sum));
    const at::Tensor output = at::empty(x.sizes(), x.options().dtype(output_dtype));
    const cuda::Activations activations = layer_norm_activations_of(sum);
    const at::Tensor mean = at::empty({activations.rows}, kernel_weight.options());
    const at::Tensor rstd = at::empty({activations.rows}, kernel_weight.options());
    cuda::AddLayerNormForwardArguments args;
    args.types = dtypes.kernel_types();
    args.x = x.data_ptr();
    args.residual = residual.data_ptr();
    args.weight = kernel_weight.data_ptr<float>();
    args.bias = kernel_bias.data_ptr<float>();
    args.eps = static_cast<float>(eps);
    args.sum = sum.data_ptr();
    args.output = output.data_ptr();
    args.mean = mean.data_ptr<float>();
    args.rstd = rstd.data_ptr<float>();
    const char* error = cuda::add_layer_norm_forward(activations, args);
    TORCH_CHECK(error == nullptr, "add_layer_norm: the fused CUDA forward failed: ", error);
    context->save_for_backward({sum, kernel_weight, mean, rstd});
    for (const auto& [name, dtype] :
         {std::pair{"x", dtypes.x},
          std::pair{"residual", dtypes.residual},
          std::pair{"weight", dtypes.weight},
          std::pair{"bias", dtypes.bias},
          std::pair{"output", dtypes.output}}) {
      context->saved_data[name] = static_cast<int64_t>(dtype);
    }
    context->set_materialize_grads(false);
    return {sum, output};
  }

  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list grad_outputs) {
    const auto dtype = [&](const char* name) {
      return static_cast<at::ScalarType>(context->saved_data[name].toInt());
    };
    const at::Tensor grad_sum = grad_outputs[0];    // may be undefined
    const at::Tensor grad_output = grad_outputs[1]; // may be undefined
    const bool parameters = context->needs_input_grad(2) || context->needs_input_grad(3);
    at::Tensor grad_total = grad_sum; // without a gradient of output: sum's own only
    at::Tensor grad_weight;
    at::Tensor grad_bias;
    if (grad_output.defined()) {
      const torch::autograd::variable_list saved = context->get_saved_variables();
      const at::Tensor& sum = saved[0];
      const c10::cuda::CUDAGuard device_guard(sum.device());
      // Row-major for the kernels, whatever layout autograd hands (an expanded scalar's).
      const at::Tensor dy = grad_output.contiguous();
      const at::Tensor direct = grad_sum.defined() ? grad_sum.contiguous() : at::Tensor();
      const cuda::Activations activations = layer_norm_activations_of(sum);
      grad_total = at::empty_like(sum);
      cuda::AddLayerNormBackwardArguments args;
      args.types =
          AddLayerNormDtypes{
              dtype("x"),
              dtype("residual"),
              at::kFloat,
              at::kFloat,
              sum.scalar_type(),
              dtype("output")}
              .kernel_types();
      args.grad_output = dy.data_ptr();
      args.grad_sum = direct.defined() ? direct.data_ptr() : nullptr;
      args.sum = sum.data_ptr();
      args.weight = saved[1].data_ptr<float>();
      args.mean = saved[2].data_ptr<float>();
      args.rstd = saved[3].data_ptr<float>();
      args.grad_sum_total = grad_total.data_ptr();
      at::Tensor workspace;
      if (parameters) {
        args.reduction = cuda::plan_reduction(activations);
        workspace =
            at::empty({args.reduction.workspace_floats(activations.channels)}, saved[1].options());
        grad_weight = at::empty({activations.channels}, saved[1].options());
        grad_bias = at::empty({activations.channels}, saved[1].options());
        args.workspace = workspace.data_ptr<float>();
        args.grad_weight = grad_weight.data_ptr<float>();
        args.grad_bias = grad_bias.data_ptr<float>();
      }
      const char* error = cuda::add_layer_norm_backward(activations, args);
      TORCH_CHECK(error == nullptr, "add_layer_norm: the fused CUDA backward failed: ", error);
    }
    const auto grad_as = [&](const at::Tensor& grad, size_t index, const char* name) {
      return grad.defined() && context->needs_input_grad(index) ? grad.to(dtype(name))
                                                                : at::Tensor();
    };
    return {
        grad_as(grad_total, 0, "x"),
        grad_as(grad_total, 1, "residual"),
        grad_as(grad_weight, 2, "weight"),
        grad_as(grad_bias, 3, "bias"),
        at::Tensor(),  // eps
        at::Tensor()}; // output_dtype
  }
};

#endif // LARGO_WITH_CUDA_KERNELS

} // namespace

AddLayerNormOutput add_layer_norm(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    double eps) {
  check_add_layer_norm_arguments(x, residual, weight, bias);
#ifdef LARGO_WITH_CUDA_KERNELS
  if (uses_fused_add_layer_norm(x, residual, weight, bias)) {
    const at::ScalarType sum_dtype = at::promote_types(x.scalar_type(), residual.scalar_type());
    const torch::autograd::variable_list outputs = FusedAddLayerNorm::apply(
        x, residual, weight, bias, eps, layer_norm_output_dtype(sum_dtype, /*cuda=*/true));
    return {outputs[0], outputs[1]};
  }
#endif
  return unfused_add_layer_norm(x, residual, weight, bias, eps);
}

bool uses_fused_add_layer_norm(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias) {
  if (!cuda_kernels_compiled() || !x.defined() || !x.is_cuda() || x.dim() < 1 || x.numel() == 0 ||
      !x.is_contiguous()) {
    return false;
  }
  if (!residual.defined() || residual.device() != x.device() || residual.sizes() != x.sizes() ||
      !residual.is_contiguous()) {
    return false;
  }
  const at::ScalarType x_dtype = x.scalar_type();
  const at::ScalarType residual_dtype = residual.scalar_type();
  if (!is_kernel_dtype(x_dtype) || !is_kernel_dtype(residual_dtype) ||
      (x_dtype != residual_dtype && x_dtype != at::kFloat && residual_dtype != at::kFloat)) {
    return false; // bfloat16 + float16 promotes to float32, a pairing no model makes
  }
  const at::ScalarType sum_dtype = at::promote_types(x_dtype, residual_dtype);
  const auto is_parameter = [&](const at::Tensor& tensor) {
    return tensor.defined() && tensor.device() == x.device() && tensor.dim() == 1 &&
           tensor.size(0) == x.size(-1) && tensor.is_contiguous();
  };
  if (!is_parameter(weight) || !is_parameter(bias) || weight.scalar_type() != bias.scalar_type()) {
    return false;
  }
  const at::ScalarType parameter_dtype = weight.scalar_type();
  // Under autocast every one of the three is cast to float32; without, ATen's layer_norm takes
  // float32 or the input's own.
  return at::autocast::is_autocast_enabled(at::kCUDA)
             ? is_kernel_dtype(parameter_dtype)
             : parameter_dtype == at::kFloat || parameter_dtype == sum_dtype;
}

} // namespace largo::kernels
