// "This parameter's gradient is ready" and "this backward pass is over" as callbacks: the
// trigger of every gradient reducer (DDP's buckets, ZeRO-2's reduce to the owner, FSDP's
// reduce-scatter).
//
// A post-hook on each parameter's gradient accumulator (the AccumulateGrad node) calls
// on_ready(index) once the gradient is in .grad; the first of them in a backward pass queues
// on_backward_end() on the autograd engine, which runs it when that backward finishes. The
// accumulators are held here: a hook on an accumulator nobody holds is silently dropped.
// The callbacks run on the autograd engine's threads; they may throw (the exception leaves
// backward()).
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace largo::parallel {

class GradReadyHooks {
 public:
  GradReadyHooks(const std::vector<at::Tensor>& params, std::function<void(size_t index)> on_ready,
                 std::function<void()> on_backward_end);
  // Removes the hooks.
  ~GradReadyHooks();
  GradReadyHooks(const GradReadyHooks&) = delete;
  GradReadyHooks& operator=(const GradReadyHooks&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

} // namespace largo::parallel
