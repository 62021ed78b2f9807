#include <largo/parallel/data_parallel/host_offload_optimizer.h>

#include <largo/core/error.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

namespace largo::parallel {
namespace {

at::Device device_of(const std::vector<optim::ParamGroup>& groups) {
  for (const optim::ParamGroup& group : groups) {
    if (!group.params.empty()) {
      return group.params.front().device();
    }
  }
  return at::Device(at::kCPU); // no pieces on this rank: nothing is copied
}

// Waits for the copies queued on the device's current stream (none to wait for on the CPU).
void wait_for_device(const at::Device& device) {
  if (device.is_cpu()) {
    return;
  }
  c10::impl::VirtualGuardImpl guard(device.type());
  guard.getStream(device).synchronize();
}

} // namespace

HostOffloadOptimizer::HostOffloadOptimizer(
    std::vector<optim::ParamGroup> device_groups, const OptimizerFactory& make_host_optimizer)
    : optim::Optimizer(std::move(device_groups)), device_(device_of(param_groups())) {
  // Pinned host memory makes the copies asynchronous; on the CPU there is nothing to pin.
  const bool pin = !device_.is_cpu();
  std::vector<optim::ParamGroup> host_groups;
  torch::NoGradGuard no_grad;
  for (const optim::ParamGroup& group : param_groups()) {
    optim::ParamGroup host_group;
    host_group.name = group.name;
    host_group.names = group.names;
    host_group.lr = group.lr;
    host_group.weight_decay = group.weight_decay;
    for (const at::Tensor& piece : group.params) {
      if (piece.device() != device_) {
        throw Error(fmt::format(
            "HostOffloadOptimizer: the pieces are on {} and {}; offload "
            "steps pieces of one device",
            device_.str(),
            piece.device().str()));
      }
      const auto options = piece.options().device(at::kCPU).pinned_memory(pin);
      at::Tensor host = at::empty(piece.sizes(), options);
      host.copy_(piece);
      device_pieces_.push_back(piece);
      host_pieces_.push_back(host);
      host_grads_.push_back(at::empty(piece.sizes(), options));
      host_group.params.push_back(host);
    }
    host_groups.push_back(std::move(host_group));
  }
  host_ = make_host_optimizer(std::move(host_groups));
}

void HostOffloadOptimizer::step() {
  // The schedule sets lr (and weight decay) on these groups; the host's follow.
  auto& groups = param_groups();
  auto& host_groups = host_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    host_groups[g].lr = groups[g].lr;
    host_groups[g].weight_decay = groups[g].weight_decay;
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < device_pieces_.size(); ++i) {
    host_pieces_[i].copy_(device_pieces_[i], /*non_blocking=*/true);
    const at::Tensor& grad = device_pieces_[i].grad();
    if (grad.defined()) {
      host_grads_[i].copy_(grad, /*non_blocking=*/true);
      host_pieces_[i].mutable_grad() = host_grads_[i];
    } else {
      host_pieces_[i].mutable_grad().reset(); // not stepped, as on the device
    }
  }
  wait_for_device(device_);
  host_->step();
  // The host copies are not written again before the next step's wait, which follows these
  // copies on the same stream.
  for (size_t i = 0; i < device_pieces_.size(); ++i) {
    device_pieces_[i].copy_(host_pieces_[i], /*non_blocking=*/true);
  }
}

void HostOffloadOptimizer::load_state_dict(const c10::IValue& state_dict) {
  host_->load_state_dict(state_dict);
  auto& groups = param_groups();
  const auto& host_groups = host_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].lr = host_groups[g].lr;
    groups[g].weight_decay = host_groups[g].weight_decay;
  }
}

void HostOffloadOptimizer::set_norm_reducer(optim::PartialNormReducer reducer) {
  if (!reducer) {
    host_->set_norm_reducer(nullptr);
    return;
  }
  host_->set_norm_reducer([reducer = std::move(reducer),
                           device = device_](const at::Tensor& partials, optim::NormReduceOp op) {
    return reducer(partials.to(device), op).to(partials.device());
  });
}

int64_t HostOffloadOptimizer::host_bytes() const {
  int64_t bytes = host_->state_bytes();
  for (size_t i = 0; i < host_pieces_.size(); ++i) {
    bytes += static_cast<int64_t>(host_pieces_[i].nbytes() + host_grads_[i].nbytes());
  }
  return bytes;
}

OptimizerFactory offload_to_host(OptimizerFactory make_optimizer) {
  return [make_optimizer = std::move(make_optimizer)](
             std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<HostOffloadOptimizer>(std::move(groups), make_optimizer);
  };
}

const HostOffloadOptimizer* find_host_offload(const optim::Optimizer& optimizer) {
  if (const auto* sharded = dynamic_cast<const ShardedOptimizer*>(&optimizer)) {
    return dynamic_cast<const HostOffloadOptimizer*>(&sharded->base());
  }
  return dynamic_cast<const HostOffloadOptimizer*>(&optimizer);
}

} // namespace largo::parallel
