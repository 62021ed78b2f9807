// Optimizer offload to host memory (DeepSpeed's ZeRO-Offload `offload_optimizer`; the
// optimizer half of FairScale FSDP's move_params_to_cpu): the sharded data-parallel modes
// (ZeRO-1, ZeRO-2, FSDP) step this rank's pieces with an optimizer that lives in host memory.
// The optimizer state and a float32 (the pieces' dtype) copy of each piece are host tensors,
// pinned when the pieces are on a GPU; the device keeps the pieces themselves (the values the
// forward reads and the all-gathers send) and their gradients, and no optimizer state.
//
// One step: each piece and its gradient are copied to the host (asynchronously, then one wait
// for the device's stream), the host optimizer steps the host copies (Largo's fused CPU
// optimizers, on the host's threads), and the updated pieces are copied back asynchronously:
// the copy back overlaps whatever the host does next (the all-gather that follows is queued
// behind it on the device). The pieces are read back every step rather than kept only on the
// host because the device's values are the trained values: rank 0's broadcast at start-up, a
// resume and SwAV's prototype normalisation write them between steps.
//
// On the CPU (host = device) the same copies run: an offloaded run equals the run without
// offload bit for bit (the same element-wise updates on the same values). On a GPU the host's
// kernels replace the device's, so the values agree to the optimizer's rounding, not bit for
// bit.
//
// Everything callers see is the device side: param_groups() are the pieces on the device (the
// loss scaler unscales and clipping measures their gradients there), and the state, its
// state_dict() and its checkpoints are the host optimizer's, in the same format as without
// offload (a checkpoint resumes either way). The host optimizer's per-parameter norms (LARC,
// LAMB) are completed over the ranks on the device (the reducer's all-reduce gets device
// tensors: NCCL takes no host tensors).
#pragma once

#include <largo/optim/optimizer.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace largo::parallel {

// parallelize.h's, declared again so that this header stands alone.
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

class HostOffloadOptimizer : public optim::Optimizer {
 public:
  // `device_groups`: the pieces to step (1-D tensors on one device, their .grad set before
  // step()); `make_host_optimizer` gets the same groups over host copies of them (same names,
  // lr and weight decay).
  HostOffloadOptimizer(
      std::vector<optim::ParamGroup> device_groups, const OptimizerFactory& make_host_optimizer);

  // Copies the pieces and their gradients to the host, steps there with the groups' current
  // lr and weight decay, copies the pieces back. A piece without a gradient is not stepped.
  void step() override;
  // The host optimizer's type: checkpoints hold its state, as without offload.
  std::string type() const override {
    return host_->type();
  }

  // The state is the host optimizer's.
  const optim::ParamState* find_state(const std::string& param_name) const override {
    return host_->find_state(param_name);
  }
  optim::ParamState& state(const std::string& param_name) override {
    return host_->state(param_name);
  }
  int64_t state_bytes() const override {
    return host_->state_bytes();
  }
  c10::IValue state_dict() const override {
    return host_->state_dict();
  }
  // Also takes the saved lr and weight decay into param_groups().
  void load_state_dict(const c10::IValue& state_dict) override;
  // Passed on to the host optimizer, which calls it with host tensors: they are moved to the
  // pieces' device for the reducer and its result back.
  void set_norm_reducer(optim::PartialNormReducer reducer) override;

  // Host bytes: the optimizer state, the pieces' copies and their gradients' copies.
  int64_t host_bytes() const;
  const optim::Optimizer& host_optimizer() const {
    return *host_;
  }

 private:
  at::Device device_;
  std::vector<at::Tensor> device_pieces_; // param_groups()' tensors, in group order
  std::vector<at::Tensor> host_pieces_;   // the host optimizer's, in the same order
  std::vector<at::Tensor> host_grads_;
  std::unique_ptr<optim::Optimizer> host_;
};

// `make_optimizer` with its optimizer moved to the host: a factory of HostOffloadOptimizers
// over the groups it is given.
OptimizerFactory offload_to_host(OptimizerFactory make_optimizer);

// The HostOffloadOptimizer that steps `optimizer`'s parameters: `optimizer` itself or a
// ShardedOptimizer's base; null without offload.
const HostOffloadOptimizer* find_host_offload(const optim::Optimizer& optimizer);

} // namespace largo::parallel
