// A stage's backward split in two, for zero-bubble pipeline schedules (zb_h1): the input
// pass computes only the gradient of the stage's input — what the previous stage waits
// for — and the weight pass, run later, the parameters' gradients.
//
// How (after torch.distributed.pipelining's stage_backward_input/weight): the autograd
// graph from the stage's output is walked once. The nodes on a path from the output to the
// input are those the input pass runs; for every parameter, walking up from its gradient
// accumulator, the first such nodes met are its "intermediates" (e.g. the matmul of a Linear
// layer: the input pass computes its input gradient, not its weight gradient). The input
// pass (torch::autograd::grad with respect to the input, graph retained) records, through a
// pre-hook, the gradients flowing into each intermediate. The weight pass, per group of
// parameters sharing intermediates, (1) runs each intermediate again on its recorded
// gradients asking only for its edges into the parameter side, then (2) runs the parameter
// side from those edges to the parameters' accumulators, and adds the results into .grad.
// Step 1 asks one intermediate at a time so that the engine never walks down the input
// path from one intermediate to another (a weight used by two layers would otherwise get
// the lower layer's gradient twice); nothing of the input pass is computed again. The graph
// and the activations it holds live until the weight pass.
//
// When the input needs no gradient (the first stage), the input pass does nothing and the
// weight pass is an ordinary backward. Gradient-accumulator hooks do not fire in the
// weight pass (gradients are added directly), so data parallelism over a split backward
// must reduce after it (PipelineParallel's reduce_gradients does).
//
// No collectives.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

namespace largo::parallel {

class SplitBackward {
 public:
  // Runs the input pass from `output` (seeded with `grad_output`; undefined for a scalar
  // loss) to `input`, and prepares the weight pass for `parameters`. Returns the
  // input's gradient (undefined when `input` does not require grad).
  static SplitBackward input_pass(
      const at::Tensor& output,
      const at::Tensor& grad_output,
      const at::Tensor& input,
      const std::vector<at::Tensor>& parameters,
      at::Tensor& input_grad);

  // Adds the parameters' gradients into their .grad (allocating it when undefined) and
  // releases the graph. Once.
  void weight_pass();

  SplitBackward(SplitBackward&&) noexcept;
  SplitBackward& operator=(SplitBackward&&) noexcept;
  ~SplitBackward();

 private:
  struct State;
  explicit SplitBackward(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

} // namespace largo::parallel
