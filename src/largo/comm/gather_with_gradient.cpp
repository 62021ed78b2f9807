#include <largo/comm/gather_with_gradient.h>

#include <torch/autograd.h>

namespace largo::comm {
namespace {

class GatherWithGradient : public torch::autograd::Function<GatherWithGradient> {
 public:
  static at::Tensor
  forward(torch::autograd::AutogradContext* context, const at::Tensor& local, ProcessGroup* group) {
    std::vector<int64_t> shape = local.sizes().vec();
    shape[0] *= group->world_size();
    // The group outlives the backward (it is the job's, or a sub-group the caller keeps), so
    // its address is saved; an IValue cannot hold the object itself.
    context->saved_data["group"] = reinterpret_cast<int64_t>(group);
    context->saved_data["rows"] = local.size(0);
    at::Tensor gathered = at::empty(shape, local.options());
    group->all_gather(gathered, local.contiguous());
    return gathered;
  }

  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list gradients) {
    auto* group = reinterpret_cast<ProcessGroup*>(context->saved_data["group"].toInt());
    const int64_t rows = context->saved_data["rows"].toInt();
    at::Tensor summed = gradients[0].contiguous().clone();
    group->all_reduce(summed);
    return {summed.narrow(0, group->rank() * rows, rows), at::Tensor()};
  }
};

} // namespace

at::Tensor all_gather_with_gradient(const at::Tensor& local, ProcessGroup& group) {
  if (group.world_size() == 1) {
    return local;
  }
  return GatherWithGradient::apply(local, &group);
}

} // namespace largo::comm
