#include "pipeline_step.h"

#include <largo/core/error.h>
#include <largo/core/torch_compat.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>
#include <largo/precision/autocast.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>

#include <chrono>

namespace largo::parallel {

using Kind = PipelineAction::Kind;
using MessageKind = PipelineMessage::Kind;

namespace {

constexpr int64_t kHeaderLength = 16; // batch, dtype, ndim, up to 13 dimensions

double seconds_elapsed_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Headers use tags above every message's (message_tag < 2 * stages * M).
int header_tag(int to_stage, const PipelineShape& shape) {
  return 2 * shape.num_stages() * shape.num_microbatches + to_stage;
}

std::string message_name(const PipelineMessage& message) {
  return fmt::format(
      "the {} of micro-batch {}",
      message.kind == MessageKind::kActivation ? "activation" : "gradient",
      message.microbatch);
}

} // namespace

PipelineStep::PipelineStep(
    const PipelineStepContext& context,
    const at::Tensor& inputs,
    const at::Tensor& targets,
    const PipelineParallel::LossFunction* loss,
    const PipelineParallel::LossScaling* scale_loss,
    bool forward_only)
    : context_(context),
      loss_(loss),
      scale_loss_(scale_loss),
      forward_only_(forward_only),
      inputs_(inputs),
      targets_(targets),
      header_sent_(static_cast<size_t>(context.shape.num_stages()), false),
      outputs_(static_cast<size_t>(context.shape.num_microbatches)) {
  const int S = context.shape.num_ranks;
  if (context.rank == 0) {
    if (!inputs.defined() || inputs.dim() == 0) {
      throw ConfigError("pipeline: the first stage's rank (pipeline rank 0) needs the batch's "
                        "inputs (a tensor with a batch dimension); got none");
    }
    set_batch_size(inputs.size(0), "the inputs");
  }
  if (context.rank == S - 1 && !forward_only) {
    if (!targets.defined() || targets.dim() == 0) {
      throw ConfigError(fmt::format(
          "pipeline: the last stage's rank (pipeline rank {}) needs the "
          "batch's targets (a tensor with a batch dimension); got none",
          S - 1));
    }
    set_batch_size(targets.size(0), "the targets");
  }
}

void PipelineStep::set_batch_size(int64_t batch_size, const char* from) {
  const int M = context_.shape.num_microbatches;
  if (batch_size_ >= 0) {
    if (batch_size != batch_size_) {
      throw ConfigError(fmt::format(
          "pipeline: the batch in {} has {} rows but this rank's has {}; every rank of a "
          "pipeline must pass the same batch",
          from,
          batch_size,
          batch_size_));
    }
    return;
  }
  if (batch_size < M) {
    throw ConfigError(fmt::format(
        "pipeline: a batch of {} cannot be split into PipelineParallelOptions::num_microbatches = "
        "{} micro-batches; use "
        "a batch of at least {} or fewer micro-batches",
        batch_size,
        M,
        M));
  }
  batch_size_ = batch_size;
  for (int i = 0; i < M; ++i) {
    microbatch_sizes_.push_back(batch_size / M + (i < batch_size % M ? 1 : 0));
  }
}

namespace {

// Rows of micro-batch `index` when `sizes` split dimension 0.
at::Tensor microbatch(const at::Tensor& batch, const std::vector<int64_t>& sizes, int index) {
  int64_t offset = 0;
  for (int i = 0; i < index; ++i) {
    offset += sizes[static_cast<size_t>(i)];
  }
  return batch.narrow(0, offset, sizes[static_cast<size_t>(index)]);
}

} // namespace

void PipelineStep::run(const RankSchedule& actions) {
  for (const PipelineAction& action : actions) {
    switch (action.kind) {
    case Kind::kForward:
      forward(action);
      break;
    case Kind::kBackward:
    case Kind::kBackwardInput:
    case Kind::kBackwardWeight:
      backward(action);
      break;
    case Kind::kSend:
      send(action.message);
      break;
    case Kind::kWaitSend:
      wait_send(action.message);
      break;
    case Kind::kPostRecv:
      post_receive(action.message);
      break;
    case Kind::kWaitRecv:
      wait_receive(action.message);
      break;
    }
  }
  // Every send has been waited for by its WaitSend; the headers are tiny and their receivers
  // need nothing more from this rank to post them, so waiting here cannot block for long.
  for (auto& work : header_sends_) {
    work.wait();
  }
  if (!sends_.empty() || !receives_.empty()) {
    throw Error(fmt::format(
        "pipeline: rank {} ended a step with {} sends and {} receives "
        "pending; the schedule is inconsistent",
        context_.rank,
        sends_.size(),
        receives_.size()));
  }
}

at::Tensor PipelineStep::run_stage(int stage, const at::Tensor& input) {
  PipelineStage module =
      context_.stages[static_cast<size_t>(context_.shape.local_index_of_stage(stage))];
  if (!context_.checkpoint_stages || forward_only_ || !torch::GradMode::is_enabled()) {
    return module->forward(input);
  }
  return checkpoint_modules(
      {module.ptr()},
      [module](const std::vector<at::Tensor>& in) mutable {
        return std::vector<at::Tensor>{module->forward(in[0])};
      },
      {input})[0];
}

void PipelineStep::forward(const PipelineAction& action) {
  const int stage = action.stage;
  const int mb = action.microbatch;
  at::Tensor input;
  if (stage == 0) {
    input = microbatch(inputs_, microbatch_sizes_, mb);
  } else {
    const PipelineMessage message{MessageKind::kActivation, mb, stage - 1, stage};
    auto node = receives_.extract(message_tag(message, context_.shape));
    input = node.mapped().tensor;
    if (!forward_only_ && input.is_floating_point()) {
      input.requires_grad_(true);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  Slot& slot = slots_[{stage, mb}];
  at::Tensor output = run_stage(stage, input);
  if (!is_last_stage(stage)) {
    slot.output = output;
  } else if (forward_only_) {
    outputs_[static_cast<size_t>(mb)] = output;
    slots_.erase({stage, mb});
  } else {
    const at::Tensor target = microbatch(targets_, microbatch_sizes_, mb);
    const double share = static_cast<double>(microbatch_sizes_[static_cast<size_t>(mb)]) /
                         static_cast<double>(batch_size_);
    at::Tensor weighted = (*loss_)(output, target) * share;
    loss_sum_ += weighted.detach().item<double>();
    slot.output = (scale_loss_ && *scale_loss_) ? (*scale_loss_)(weighted) : weighted;
  }
  if (!forward_only_ && slots_.count({stage, mb})) {
    slot.input = input;
  }
  busy_seconds_ += seconds_elapsed_since(start);
}

void PipelineStep::backward(const PipelineAction& action) {
  const int stage = action.stage;
  const int mb = action.microbatch;
  Slot& slot = slots_.at({stage, mb});
  const auto start = std::chrono::steady_clock::now();
  if (action.kind == Kind::kBackwardWeight) {
    slot.split->weight_pass();
    slots_.erase({stage, mb});
    busy_seconds_ += seconds_elapsed_since(start);
    return;
  }
  at::Tensor grad;
  if (!is_last_stage(stage)) {
    const PipelineMessage message{MessageKind::kGradient, mb, stage + 1, stage};
    grad = receives_.extract(message_tag(message, context_.shape)).mapped().tensor;
  }
  // Backward runs with autocast off (PyTorch's advice): it computes in the dtypes that
  // autocast chose in the forward.
  const auto device_type = slot.output.device().type();
  std::optional<precision::AutocastGuard> no_autocast;
  if (compat::is_autocast_enabled(device_type)) {
    no_autocast.emplace(device_type, compat::get_autocast_dtype(device_type), false);
  }
  if (action.kind == Kind::kBackward) {
    if (slot.output.requires_grad()) {
      std::vector<at::Tensor> seeds;
      if (grad.defined()) {
        seeds.push_back(grad);
      }
      torch::autograd::backward({slot.output}, seeds);
    }
    slot.input_grad = stage > 0 ? slot.input.grad() : at::Tensor();
  } else {
    const auto local = static_cast<size_t>(context_.shape.local_index_of_stage(stage));
    slot.split = SplitBackward::input_pass(
        slot.output, grad, slot.input, context_.stage_parameters[local], slot.input_grad);
  }
  if (stage > 0 && !slot.input_grad.defined()) {
    slot.input_grad = at::zeros_like(slot.input); // the stage ignored its input
  }
  slot.output = at::Tensor();
  slot.input = at::Tensor();
  if (stage == 0 && !slot.split) {
    slots_.erase({stage, mb});
  }
  busy_seconds_ += seconds_elapsed_since(start);
}

void PipelineStep::send(const PipelineMessage& message) {
  const int peer = context_.shape.rank_of_stage(message.to_stage);
  const int tag = message_tag(message, context_.shape);
  Slot& slot = slots_.at({message.from_stage, message.microbatch});
  at::Tensor tensor;
  if (message.kind == MessageKind::kActivation) {
    tensor = slot.output.detach().contiguous();
    const int64_t rows = microbatch_sizes_[static_cast<size_t>(message.microbatch)];
    if (tensor.dim() == 0 || tensor.size(0) != rows || tensor.dim() > kHeaderLength - 3) {
      throw Error(fmt::format(
          "pipeline stage {} returned a tensor of shape [{}] for micro-batch {} of {} samples: "
          "stage outputs must be batch-first (dimension 0 = the micro-batch) with at most {} "
          "dimensions",
          message.from_stage,
          fmt::join(tensor.sizes(), ", "),
          message.microbatch,
          rows,
          kHeaderLength - 3));
    }
    if (!header_sent_[static_cast<size_t>(message.from_stage)]) {
      std::vector<int64_t> values(kHeaderLength, 0);
      values[0] = batch_size_;
      values[1] = static_cast<int64_t>(tensor.scalar_type());
      values[2] = tensor.dim() - 1;
      for (int64_t d = 1; d < tensor.dim(); ++d) {
        values[static_cast<size_t>(2 + d)] = tensor.size(d);
      }
      // On the stages' device: NCCL moves only CUDA tensors.
      at::Tensor header = at::tensor(values, at::kLong).to(context_.device);
      with_stage_names(message, /*sending=*/true, [&] {
        header_sends_.push_back(
            context_.group->send_async(header, peer, header_tag(message.to_stage, context_.shape)));
      });
      header_sent_[static_cast<size_t>(message.from_stage)] = true;
    }
    if (forward_only_) {
      slots_.erase({message.from_stage, message.microbatch});
    }
  } else {
    tensor = slot.input_grad.contiguous();
    slot.input_grad = at::Tensor();
    if (!slot.split) {
      slots_.erase({message.from_stage, message.microbatch});
    }
  }
  Transfer& transfer = sends_[tag];
  transfer.tensor = tensor;
  with_stage_names(message, /*sending=*/true, [&] {
    transfer.work = context_.group->send_async(tensor, peer, tag);
  });
}

void PipelineStep::wait_send(const PipelineMessage& message) {
  auto node = sends_.extract(message_tag(message, context_.shape));
  wait_named(node.mapped().work, message, /*sending=*/true);
}

void PipelineStep::read_header(int stage) {
  Header& header = headers_[stage];
  if (header.read) {
    return;
  }
  if (!header.posted) {
    header.data = at::empty({kHeaderLength}, at::TensorOptions(at::kLong).device(context_.device));
    with_stage_names(PipelineMessage{MessageKind::kActivation, 0, stage - 1, stage}, false, [&] {
      header.work = context_.group->recv_async(
          header.data, context_.shape.rank_of_stage(stage - 1), header_tag(stage, context_.shape));
    });
    header.posted = true;
  }
  wait_named(header.work, PipelineMessage{MessageKind::kActivation, 0, stage - 1, stage}, false);
  const at::Tensor host = header.data.cpu();
  const auto* values = host.data_ptr<int64_t>();
  set_batch_size(values[0], "the previous stage's header");
  header.dtype = static_cast<at::ScalarType>(values[1]);
  header.sample_shape.assign(values + 3, values + 3 + values[2]);
  header.read = true;
}

bool PipelineStep::post_if_shape_known(const PipelineMessage& message, Transfer& transfer) {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  if (message.kind == MessageKind::kActivation) {
    const Header& header = headers_[message.to_stage];
    if (!header.read) {
      return false;
    }
    shape.push_back(microbatch_sizes_[static_cast<size_t>(message.microbatch)]);
    shape.insert(shape.end(), header.sample_shape.begin(), header.sample_shape.end());
    dtype = header.dtype;
  } else {
    auto it = slots_.find({message.to_stage, message.microbatch});
    if (it == slots_.end() || !it->second.output.defined()) {
      return false; // this stage's forward of the micro-batch has not run yet
    }
    shape = it->second.output.sizes().vec();
    dtype = it->second.output.scalar_type();
  }
  transfer.tensor = at::empty(shape, at::TensorOptions().dtype(dtype).device(context_.device));
  with_stage_names(message, /*sending=*/false, [&] {
    transfer.work = context_.group->recv_async(
        transfer.tensor,
        context_.shape.rank_of_stage(message.from_stage),
        message_tag(message, context_.shape));
  });
  transfer.posted = true;
  return true;
}

void PipelineStep::post_receive(const PipelineMessage& message) {
  Transfer& transfer = receives_[message_tag(message, context_.shape)];
  if (message.kind == MessageKind::kActivation && !headers_[message.to_stage].read) {
    Header& header = headers_[message.to_stage];
    if (!header.posted) { // post the header now; the activation once it is read
      header.data =
          at::empty({kHeaderLength}, at::TensorOptions(at::kLong).device(context_.device));
      with_stage_names(message, /*sending=*/false, [&] {
        header.work = context_.group->recv_async(
            header.data,
            context_.shape.rank_of_stage(message.from_stage),
            header_tag(message.to_stage, context_.shape));
      });
      header.posted = true;
    }
    return;
  }
  post_if_shape_known(message, transfer);
}

at::Tensor PipelineStep::wait_receive(const PipelineMessage& message) {
  Transfer& transfer = receives_[message_tag(message, context_.shape)];
  if (message.kind == MessageKind::kActivation) {
    read_header(message.to_stage);
  }
  if (!transfer.posted && !post_if_shape_known(message, transfer)) {
    throw Error(fmt::format(
        "pipeline: stage {} cannot receive {} before its forward ran",
        message.to_stage,
        message_name(message)));
  }
  wait_named(transfer.work, message, /*sending=*/false);
  return transfer.tensor;
}

void PipelineStep::wait_named(comm::Work& work, const PipelineMessage& message, bool sending) {
  with_stage_names(message, sending, [&] { work.wait(); });
}

void PipelineStep::with_stage_names(
    const PipelineMessage& message, bool sending, const std::function<void()>& communicate) {
  try {
    communicate();
  } catch (const CommError& e) {
    const int own = sending ? message.from_stage : message.to_stage;
    const int peer = sending ? message.to_stage : message.from_stage;
    const int peer_rank = context_.shape.rank_of_stage(peer);
    throw CommError(fmt::format(
        "pipeline stage {} (pipeline rank {}) {} {} {} stage {} (pipeline rank {}, job rank {}), "
        "which failed; stage {} has probably died or stalled, see its output. {}",
        own,
        context_.rank,
        sending ? "sending" : "waiting for",
        message_name(message),
        sending ? "to" : "from",
        peer,
        peer_rank,
        context_.group->global_rank(peer_rank),
        peer,
        e.what()));
  }
}

at::Tensor PipelineStep::outputs() const {
  if (context_.rank != context_.shape.num_ranks - 1) {
    return at::Tensor();
  }
  return at::cat(outputs_, 0);
}

} // namespace largo::parallel
