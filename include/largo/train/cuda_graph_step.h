// The whole training step as one CUDA graph (TrainerOptions::cuda_graph; MACHINE.CUDA_GRAPH).
// The host's cost of a step (launching a thousand kernels, the autograd engine, the
// optimizer's loops) is paid once: after `warmup_steps` eager steps (the allocator's blocks,
// cuDNN's plans, the optimizer's state made), one TrainStep::run is captured into a graph
// with its own memory pool, over static input buffers, and every later step copies its
// batches into those buffers and replays the graph.
//
// What the graph reads each step lives in device tensors the host updates before a replay:
// the batches, and each parameter group's learning rate (optim::ParamGroup::lr_on_device,
// which Largo's fused CUDA SGD reads). Everything else is fixed at capture: the shapes (the
// same micro-batch sizes every step), the weight decay, the step's code path. The step must
// not read anything on the host (TrainStepOptions::sync_every_step false); its losses and
// inf/NaN flag come back as StepResult::unread, copies of the graph's outputs, for
// read_step_results. RunPlan refuses at start what cannot be captured
// (train/run_plan.cpp, resolve_cuda_graph), by name; what it cannot foresee (an optimizer
// path that reads its learning rate on the host) throws at the first warm-up step.
//
// Random numbers (dropout) come from the CUDA generator, which a graph replays with a new
// offset each time (ATen registers it at capture). Not collective: one process (RunPlan
// refuses several ranks for now).
#pragma once

#include <largo/train/train_step.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace largo::train {

class CudaGraphStep {
 public:
  // `step` and `model` outlive this; `model` on the CUDA `device`. Throws largo::Error for
  // another device or in a build whose libtorch has no CUDA, OptionError for an optimizer
  // other than SGD.
  CudaGraphStep(
      TrainStep& step,
      parallel::ParallelModel& model,
      torch::Device device,
      int64_t warmup_steps = 3);
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  // One step over `num_micro_batches` batches from `next_batch` (the same sizes every call
  // once captured; another size throws largo::Error naming both): eager during the warm-up,
  // captured and replayed at the step after it, replayed from then on. The result is unread.
  StepResult run(const std::function<data::Batch()>& next_batch, int64_t num_micro_batches);

  // Whether the step is captured (the warm-up is over).
  bool captured() const;

 private:
  struct Graph; // the CUDA graph, its static buffers and outputs
  void capture(std::vector<data::Batch>& batches);
  void copy_to_inputs(std::vector<data::Batch>& batches);

  TrainStep& step_;
  parallel::ParallelModel& model_;
  torch::Device device_;
  int64_t warmup_steps_;
  int64_t steps_ = 0;
  std::unique_ptr<Graph> graph_;
};

} // namespace largo::train
