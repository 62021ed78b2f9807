// Intercepting the forward of a module that is an element of a torch::nn::Sequential: the
// one place libtorch calls a submodule through a table Largo can change (there are no
// forward hooks in C++). FSDP gathers a unit's parameters around it, activation
// checkpointing recomputes it (wrap_policy.h chooses which elements).
//
// Only the Sequential's forward path changes: element i's entry in its list of modules to
// run is replaced, while the module itself stays registered under its name, so
// named_parameters(), state dicts, to(), train()/eval() and parameter names are unchanged.
// Sequential::ptr(i) and operator[] return what runs (the interceptor): reach the module
// itself through named_children(). No collectives.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>

namespace largo::parallel {

// A tensor -> tensor module around a function: what an interceptor runs in an element's place.
class TensorFunctionImpl : public torch::nn::Module {
 public:
  explicit TensorFunctionImpl(std::function<at::Tensor(const at::Tensor&)> function)
      : function_(std::move(function)) {}
  at::Tensor forward(at::Tensor x) {
    return function_(x);
  }

 private:
  std::function<at::Tensor(const at::Tensor&)> function_;
};
TORCH_MODULE(TensorFunction);

// What element `index` of `container` runs now (the module itself, or an interceptor
// installed earlier). Throws largo::Error for an index out of range.
torch::nn::AnyModule sequential_element_forward(torch::nn::SequentialImpl& container, size_t index);

// Runs `interceptor` in place of element `index` of `container`. Throws largo::Error for an
// index out of range or a Sequential whose run list does not mirror its registered children.
void intercept_sequential_element(torch::nn::SequentialImpl& container, size_t index,
                                  std::function<at::Tensor(const at::Tensor&)> interceptor);

} // namespace largo::parallel
