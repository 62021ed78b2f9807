#include <largo/parallel/activation_checkpointing/sequential_interception.h>

#include <largo/core/error.h>

#include <fmt/format.h>

namespace largo::parallel {
namespace {

void check_index(torch::nn::SequentialImpl& container, size_t index) {
  if (container.size() != container.named_children().size()) {
    throw Error(fmt::format(
        "a Sequential with {} modules to run but {} registered children cannot be wrapped "
        "element by element",
        container.size(), container.named_children().size()));
  }
  if (index >= container.size()) {
    throw Error(fmt::format("Sequential element {} does not exist (it has {})", index,
                            container.size()));
  }
}

} // namespace

torch::nn::AnyModule sequential_element_forward(torch::nn::SequentialImpl& container,
                                                size_t index) {
  check_index(container, index);
  return *(container.begin() + static_cast<std::ptrdiff_t>(index));
}

void intercept_sequential_element(torch::nn::SequentialImpl& container, size_t index,
                                  std::function<at::Tensor(const at::Tensor&)> interceptor) {
  check_index(container, index);
  *(container.begin() + static_cast<std::ptrdiff_t>(index)) =
      torch::nn::AnyModule(TensorFunction(std::move(interceptor)));
}

} // namespace largo::parallel
