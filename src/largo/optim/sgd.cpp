#include <largo/optim/sgd.h>

#include "multi_tensor_cpu.h"
#include "param_loop.h"

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

namespace largo::optim {
namespace {

// One parameter's update in the fused CPU pass.
struct FusedSgdItem {
  at::Tensor param, grad, buffer; // buffer undefined without momentum
  double lr = 0.0;
  double weight_decay = 0.0;
  bool first_step = false; // the buffer starts as the gradient
};

// The expressions of torch.optim.SGD, in its order, over [0, n) of one chunk. The switches
// are template parameters so that each variant is a straight loop the compiler vectorizes.
template <typename scalar_t, bool kDecay, bool kMomentum, bool kFirstStep, bool kNesterov>
void sgd_loop(
    scalar_t* __restrict__ p,
    const scalar_t* __restrict__ g,
    scalar_t* __restrict__ buf,
    int64_t n,
    scalar_t weight_decay,
    scalar_t momentum,
    scalar_t one_minus_dampening,
    scalar_t neg_lr) {
  for (int64_t i = 0; i < n; ++i) {
    scalar_t d = g[i];
    if constexpr (kDecay) {
      d = g[i] + weight_decay * p[i];
    }
    if constexpr (kMomentum) {
      scalar_t b = d;
      if constexpr (!kFirstStep) {
        b = buf[i] * momentum + one_minus_dampening * d;
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        d = d + momentum * b;
      } else {
        d = b;
      }
    }
    p[i] = p[i] + neg_lr * d;
  }
}

template <typename scalar_t>
void sgd_kernel(
    const FusedSgdItem& item, const SGDOptions& options, int64_t begin, int64_t end) {
  const bool use_momentum = options.momentum != 0.0;
  scalar_t* p = item.param.data_ptr<scalar_t>() + begin;
  const scalar_t* g = item.grad.data_ptr<scalar_t>() + begin;
  scalar_t* buf = use_momentum ? item.buffer.data_ptr<scalar_t>() + begin : nullptr;
  using detail::with_flag;
  with_flag(item.weight_decay != 0.0, [&](auto decay) {
    with_flag(use_momentum, [&](auto momentum) {
      with_flag(item.first_step, [&](auto first_step) {
        with_flag(options.nesterov, [&](auto nesterov) {
          // Scalars are cast to the tensor dtype as ATen does for a Scalar operand.
          sgd_loop<scalar_t, decltype(decay)::value, decltype(momentum)::value,
                   decltype(first_step)::value, decltype(nesterov)::value>(
              p, g, buf, end - begin, static_cast<scalar_t>(item.weight_decay),
              static_cast<scalar_t>(options.momentum),
              static_cast<scalar_t>(1.0 - options.dampening), static_cast<scalar_t>(-item.lr));
        });
      });
    });
  });
}

// True when two tensors of one shape lay their elements out in the same order: their strides
// agree on every dimension longer than 1 (a dimension of size 1 may have any stride, e.g. a
// 1x1 convolution's channels-last weight against its gradient; ATen's fused kernels compare
// strides the same way).
bool same_memory_order(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) {
    return false;
  }
  for (int64_t dim = 0; dim < a.dim(); ++dim) {
    if (a.size(dim) != 1 && a.stride(dim) != b.stride(dim)) {
      return false;
    }
  }
  return true;
}

// True when ATen's fused CUDA kernel (torch.optim.SGD(fused=True)) can take the tensors: on
// one CUDA device, of one floating dtype, dense, their elements in the same order.
bool can_use_fused_cuda_kernel(std::initializer_list<const at::Tensor*> tensors) {
  const at::Tensor* first = *tensors.begin();
  if (!first->defined() || !first->is_cuda() || !at::isFloatingType(first->scalar_type())) {
    return false;
  }
  for (const at::Tensor* t : tensors) {
    if (!t->defined() || t->layout() != at::kStrided || t->device() != first->device() ||
        t->scalar_type() != first->scalar_type() || !t->is_non_overlapping_and_dense() ||
        !same_memory_order(*t, *first)) {
      return false;
    }
  }
  return true;
}

// The CUDA parameters of one group that take the fused kernel, split by whether their
// momentum buffer is new (the kernel's is_first_step is one flag per call).
struct FusedCudaLists {
  std::vector<at::Tensor> params[2], grads[2], buffers[2]; // [0] existing buffers, [1] new
};

void fused_cuda_step(FusedCudaLists& lists, const ParamGroup& group, const SGDOptions& options) {
  for (int first_step = 0; first_step < 2; ++first_step) {
    if (lists.params[first_step].empty()) {
      continue;
    }
    if (group.lr_on_device.defined()) { // read on the device: a CUDA graph replays it
      at::_fused_sgd_(
          lists.params[first_step],
          lists.grads[first_step],
          lists.buffers[first_step],
          group.weight_decay,
          options.momentum,
          group.lr_on_device,
          options.dampening,
          options.nesterov,
          /*maximize=*/false,
          /*is_first_step=*/first_step == 1);
      continue;
    }
    at::_fused_sgd_(
        lists.params[first_step],
        lists.grads[first_step],
        lists.buffers[first_step], // empty without momentum
        group.weight_decay,
        options.momentum,
        group.lr,
        options.dampening,
        options.nesterov,
        /*maximize=*/false,
        /*is_first_step=*/first_step == 1);
  }
}

// The ops of torch.optim.SGD(foreach=True) (PyTorch 1.13), in its order, except that nesterov
// does not write into the gradients as PyTorch's foreach path does. An undefined buffer (a
// first step) is replaced by the new one.
void foreach_step(
    const std::vector<at::Tensor>& params,
    const std::vector<at::Tensor>& grads,
    std::vector<at::Tensor>& buffers,
    const ParamGroup& group,
    const SGDOptions& options) {
  std::vector<at::Tensor> updates =
      group.weight_decay != 0.0 ? at::_foreach_add(grads, params, group.weight_decay) : grads;
  if (options.momentum != 0.0) {
    std::vector<at::Tensor> existing, existing_updates;
    for (size_t k = 0; k < params.size(); ++k) {
      if (buffers[k].defined()) {
        existing.push_back(buffers[k]);
        existing_updates.push_back(updates[k]);
      } else {
        buffers[k] = updates[k].clone().detach();
      }
    }
    if (!existing.empty()) {
      at::_foreach_mul_(existing, options.momentum);
      at::_foreach_add_(existing, existing_updates, 1.0 - options.dampening);
    }
    updates = options.nesterov ? at::_foreach_add(updates, buffers, options.momentum) : buffers;
  }
  at::_foreach_add_(params, updates, -group.lr);
}

// The fused CPU pass over every item, all parameters' chunks in one parallel region.
void fused_cpu_step(const std::vector<FusedSgdItem>& fused, const SGDOptions& options) {
  const std::vector<detail::Chunk> chunks = detail::chunks_of_items(fused);
  detail::for_each_chunk(chunks, [&](int64_t, const detail::Chunk& chunk) {
    const FusedSgdItem& item = fused[static_cast<size_t>(chunk.tensor)];
    AT_DISPATCH_FLOATING_TYPES(item.param.scalar_type(), "sgd_step", [&] {
      sgd_kernel<scalar_t>(item, options, chunk.begin, chunk.end);
    });
  });
}

} // namespace

SGD::SGD(std::vector<ParamGroup> param_groups, SGDOptions options)
    : Optimizer(std::move(param_groups)), options_(options) {
  if (!(options_.momentum >= 0.0)) {
    throw ConfigError(fmt::format(
        "SGDOptions::momentum = {} is invalid; use a value >= 0 (0 turns momentum off)",
        options_.momentum));
  }
  if (options_.nesterov && (options_.momentum <= 0.0 || options_.dampening != 0.0)) {
    throw ConfigError(fmt::format(
        "SGDOptions::nesterov = true needs SGDOptions::momentum > 0 and dampening = 0, got "
        "momentum = {} and dampening = {}; set nesterov to false or fix those values",
        options_.momentum,
        options_.dampening));
  }
}

std::vector<std::pair<std::string, c10::IValue>> SGD::hyperparameters() const {
  return {
      {"momentum", options_.momentum},
      {"dampening", options_.dampening},
      {"nesterov", options_.nesterov}};
}

void SGD::step() {
  torch::NoGradGuard no_grad;
  const double momentum = options_.momentum;
  std::vector<ParamGroup>& groups = param_groups();
  std::vector<FusedSgdItem> fused;
  // Per group (lr and weight decay are per group): the _foreach path's and the fused CUDA
  // kernel's lists; the CPU pass takes every group's items at once.
  struct GroupLists {
    std::vector<at::Tensor> params, grads, buffers;
    std::vector<std::pair<size_t, std::string>> new_buffers; // (index in buffers, name)
    FusedCudaLists fused_cuda;
  };
  std::vector<GroupLists> lists(groups.size());
  detail::for_each_dense_grad(groups, "SGD", [&](const detail::GradParam<ParamGroup>& item) {
    const at::Tensor& param = item.param;
    const at::Tensor& grad = item.grad;
    at::Tensor buffer;
    bool first_step = false; // a momentum buffer is made this step
    if (momentum != 0.0) {
      ParamState& param_state = state(item.name());
      auto it = param_state.find("momentum_buffer");
      first_step = it == param_state.end();
      if (!first_step) {
        buffer = it->second;
      }
    }
    // A new buffer will take the gradient's layout.
    const at::Tensor* buffer_layout = buffer.defined() ? &buffer : &grad;
    const bool on_cpu =
        options_.fused && detail::can_use_cpu_kernels({&param, &grad, buffer_layout});
    const bool on_cuda =
        options_.fused && !on_cpu && can_use_fused_cuda_kernel({&param, &grad, buffer_layout});
    if (!on_cuda && item.group.lr_on_device.defined()) {
      throw TrainingError(fmt::format(
          "SGD: parameter {} cannot take the fused CUDA kernel (its gradient's device, dtype or "
          "layout differs from the parameter's), and its group's learning rate is read on the "
          "device (ParamGroup::lr_on_device, a CUDA graph): the other paths read it on the host",
          item.name()));
    }
    GroupLists& list = lists[item.group_index];
    if (on_cpu || on_cuda) {
      if (first_step) { // torch.clone keeps the gradient's layout
        buffer = at::empty_like(grad, at::MemoryFormat::Preserve);
        state(item.name())["momentum_buffer"] = buffer;
      }
      if (on_cpu) {
        fused.push_back({param, grad, buffer, item.group.lr, item.group.weight_decay, first_step});
      } else {
        const int slot = first_step ? 1 : 0;
        list.fused_cuda.params[slot].push_back(param);
        list.fused_cuda.grads[slot].push_back(grad);
        if (momentum != 0.0) {
          list.fused_cuda.buffers[slot].push_back(buffer);
        }
      }
      return;
    }
    list.params.push_back(param);
    list.grads.push_back(grad);
    list.buffers.push_back(buffer);
    if (first_step) {
      list.new_buffers.emplace_back(list.buffers.size() - 1, item.name());
    }
  });
  for (size_t g = 0; g < groups.size(); ++g) {
    GroupLists& list = lists[g];
    fused_cuda_step(list.fused_cuda, groups[g], options_);
    if (!list.params.empty()) {
      foreach_step(list.params, list.grads, list.buffers, groups[g], options_);
      for (const auto& [k, name] : list.new_buffers) { // the buffers foreach_step made
        state(name)["momentum_buffer"] = list.buffers[k];
      }
    }
  }
  fused_cpu_step(fused, options_);
}

} // namespace largo::optim
