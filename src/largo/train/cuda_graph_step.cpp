#include <largo/train/cuda_graph_step.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#if __has_include(<ATen/cuda/CUDAGraph.h>)
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define LARGO_HAS_CUDA_GRAPHS 1
#endif

#include <utility>
#include <vector>

namespace largo::train {

#ifdef LARGO_HAS_CUDA_GRAPHS

struct CudaGraphStep::Graph {
  at::cuda::CUDAGraph graph;
  std::vector<data::Batch> inputs; // static, on the device
  StepResult outputs;              // the captured step's: num_images and the unread tensors
};

namespace {

std::vector<data::Batch>
take_batches(const std::function<data::Batch()>& next_batch, int64_t num_micro_batches) {
  std::vector<data::Batch> batches;
  for (int64_t micro = 0; micro < num_micro_batches; ++micro) {
    batches.push_back(next_batch());
  }
  return batches;
}

// Every tensor of a batch, in a fixed order: the images (or the views), then the labels.
std::vector<at::Tensor*> tensors_of(data::Batch& batch) {
  std::vector<at::Tensor*> tensors;
  if (batch.views.empty()) {
    tensors.push_back(&batch.images);
  }
  for (at::Tensor& view : batch.views) {
    tensors.push_back(&view);
  }
  tensors.push_back(&batch.labels);
  return tensors;
}

// The sizes of every micro-batch's tensors, for the message when a step's differ.
std::string describe_sizes(std::vector<data::Batch>& batches) {
  std::vector<std::string> parts;
  for (data::Batch& batch : batches) {
    for (at::Tensor* tensor : tensors_of(batch)) {
      parts.push_back(fmt::format("{}", fmt::join(tensor->sizes(), "x")));
    }
  }
  return fmt::format("{} micro-batch(es) of [{}]", batches.size(), fmt::join(parts, ", "));
}

// Each parameter group's learning rate as a device tensor (optim::ParamGroup::lr_on_device),
// set from the group's lr, which the host's schedule changes between steps.
void put_learning_rates_on_device(parallel::ParallelModel& model, const at::Device& device) {
  for (optim::ParamGroup& group : model.optimizer().param_groups()) {
    if (!group.lr_on_device.defined()) {
      group.lr_on_device =
          at::full({}, group.lr, at::TensorOptions().dtype(at::kFloat).device(device));
    } else {
      group.lr_on_device.fill_(group.lr);
    }
  }
}

// Runs `work` on a side stream (warm-up and capture must not run on the default stream),
// ordered after what the current stream has queued and before what it queues next.
template <typename Work>
auto on_side_stream(const at::Device& device, Work&& work) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(side);
  auto result = [&] {
    const c10::cuda::CUDAStreamGuard guard(side);
    return work();
  }();
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(current);
  return result;
}

data::Batch device_copy(data::Batch batch, const at::Device& device) {
  for (at::Tensor* tensor : tensors_of(batch)) {
    *tensor = tensor->to(device, /*non_blocking=*/true, /*copy=*/true);
  }
  return batch;
}

} // namespace

CudaGraphStep::CudaGraphStep(
    TrainStep& step, parallel::ParallelModel& model, torch::Device device, int64_t warmup_steps)
    : step_(step), model_(model), device_(device), warmup_steps_(warmup_steps) {
  if (!device_.is_cuda()) {
    throw Error(fmt::format(
        "CudaGraphStep: the step runs on {}; CUDA graphs need a CUDA device", device_.str()));
  }
  if (model_.optimizer().type() != "sgd") {
    throw OptionError(
        "TrainerOptions::cuda_graph",
        "on",
        fmt::format(
            "off with optimizer {}: only SGD's fused CUDA kernel reads its learning rate from "
            "the device, as a replayed graph must",
            model_.optimizer().type()));
  }
}

CudaGraphStep::~CudaGraphStep() = default;

bool CudaGraphStep::captured() const {
  return graph_ != nullptr;
}

StepResult
CudaGraphStep::run(const std::function<data::Batch()>& next_batch, int64_t num_micro_batches) {
  std::vector<data::Batch> batches = take_batches(next_batch, num_micro_batches);
  put_learning_rates_on_device(model_, device_);
  if (graph_ == nullptr && steps_ < warmup_steps_) { // eager: caches, plans, optimizer state
    ++steps_;
    size_t next = 0;
    return on_side_stream(
        device_, [&] { return step_.run([&] { return batches.at(next++); }, num_micro_batches); });
  }
  if (graph_ == nullptr) {
    capture(batches);
  } else {
    copy_to_inputs(batches);
  }
  graph_->graph.replay();
  ++steps_;
  StepResult result;
  result.num_images = graph_->outputs.num_images;
  const StepResult::OnDevice& outputs = *graph_->outputs.unread;
  // Copies: the next replay overwrites the graph's own outputs.
  const at::Tensor& flag = outputs.non_finite;
  result.unread =
      StepResult::OnDevice{outputs.losses.clone(), flag.defined() ? flag.clone() : at::Tensor()};
  return result;
}

// Captures the step over static copies of `batches` (which the replay after it computes).
// Thread-local capture: the loader's threads keep pinning host memory meanwhile.
void CudaGraphStep::capture(std::vector<data::Batch>& batches) {
  graph_ = std::make_unique<Graph>();
  for (data::Batch& batch : batches) {
    graph_->inputs.push_back(device_copy(batch, device_));
  }
  model_.zero_grad(); // the gradients are made inside the graph's pool
  size_t next = 0;
  graph_->outputs = on_side_stream(device_, [&] {
    graph_->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    StepResult captured =
        step_.run([&] { return graph_->inputs.at(next++); }, static_cast<int64_t>(batches.size()));
    graph_->graph.capture_end();
    return captured;
  });
  if (!graph_->outputs.unread) {
    throw Error("CudaGraphStep: the captured step read its results on the host; construct "
                "its TrainStep with TrainStepOptions::sync_every_step = false");
  }
}

// This step's batches into the static buffers the graph reads.
void CudaGraphStep::copy_to_inputs(std::vector<data::Batch>& batches) {
  auto mismatch = [&] {
    return Error(fmt::format(
        "CudaGraphStep: this step has {} where the captured step has {}; a CUDA graph replays "
        "fixed shapes (drop the last incomplete batch: DataSplitOptions::drop_last, and give "
        "every step the same number of micro-batches)",
        describe_sizes(batches),
        describe_sizes(graph_->inputs)));
  };
  if (batches.size() != graph_->inputs.size()) {
    throw mismatch();
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    const std::vector<at::Tensor*> from = tensors_of(batches[i]);
    const std::vector<at::Tensor*> to = tensors_of(graph_->inputs[i]);
    for (size_t t = 0; t < to.size(); ++t) {
      if (from.size() != to.size() || from[t]->sizes() != to[t]->sizes()) {
        throw mismatch();
      }
      to[t]->copy_(*from[t], /*non_blocking=*/true);
    }
  }
}

#else // a libtorch without CUDA

struct CudaGraphStep::Graph {};

CudaGraphStep::CudaGraphStep(
    TrainStep& step, parallel::ParallelModel& model, torch::Device device, int64_t warmup_steps)
    : step_(step), model_(model), device_(device), warmup_steps_(warmup_steps) {
  throw Error("CudaGraphStep: this build's libtorch has no CUDA");
}

CudaGraphStep::~CudaGraphStep() = default;

bool CudaGraphStep::captured() const {
  return false;
}

StepResult CudaGraphStep::run(const std::function<data::Batch()>&, int64_t) {
  throw Error("CudaGraphStep: this build's libtorch has no CUDA");
}

#endif

} // namespace largo::train
