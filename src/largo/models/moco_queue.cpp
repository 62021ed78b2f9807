#include <largo/models/moco_queue.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::models {

MocoQueue::MocoQueue(MocoQueueOptions options, at::Generator generator, c10::Device device)
    : options_(options) {
  require_option(
      options_.embedding_dim > 0,
      "MocoQueueOptions::embedding_dim",
      std::to_string(options_.embedding_dim),
      "> 0");
  require_option(options_.size > 0, "MocoQueueOptions::size", std::to_string(options_.size), "> 0");
  const at::Tensor drawn = at::randn({options_.embedding_dim, options_.size}, generator);
  queue_ = (drawn / drawn.norm(2, 0, /*keepdim=*/true).clamp_min(1e-12)).to(device);
}

void MocoQueue::enqueue(const at::Tensor& key, comm::ProcessGroup& group) {
  TORCH_CHECK(
      key.dim() == 2 && key.size(1) == options_.embedding_dim,
      "MocoQueue::enqueue: expected keys [n, ",
      options_.embedding_dim,
      "], got ",
      key.sizes());
  at::NoGradGuard no_grad;
  const at::Tensor local = key.detach().to(queue_.scalar_type()).contiguous();
  at::Tensor gathered = local;
  if (group.world_size() > 1) {
    gathered = at::empty({group.world_size() * local.size(0), local.size(1)}, local.options());
    group.all_gather(gathered, local);
  }
  const int64_t batch = gathered.size(0);
  require_option(
      options_.size % batch == 0,
      "MocoQueueOptions::size",
      std::to_string(options_.size),
      fmt::format(
          "a multiple of the global batch ({} keys per enqueue), so that a batch never wraps "
          "around the queue's end",
          batch));
  queue_.narrow(1, pointer_, batch).copy_(gathered.t());
  pointer_ = (pointer_ + batch) % options_.size;
}

std::map<std::string, at::Tensor> MocoQueue::state_dict() const {
  return {
      {"queue", queue_.is_cpu() ? queue_.clone() : queue_.cpu()},
      {"queue_ptr", at::tensor({pointer_}, at::kLong)}};
}

void MocoQueue::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  const auto queue = state.find("queue");
  const auto pointer = state.find("queue_ptr");
  if (queue == state.end() || pointer == state.end() || queue->second.sizes() != queue_.sizes() ||
      pointer->second.numel() != 1) {
    throw CheckpointError(fmt::format(
        "MoCo queue state: expected \"queue\" of shape [{}] and \"queue_ptr\" (embedding_dim "
        "and queue_size must be those of the run that saved it)",
        fmt::join(queue_.sizes(), ", ")));
  }
  queue_.copy_(queue->second);
  pointer_ = pointer->second.item<int64_t>();
  if (pointer_ < 0 || pointer_ >= options_.size) {
    throw CheckpointError(
        fmt::format("MoCo queue state: queue_ptr {} is outside [0, {})", pointer_, options_.size));
  }
}

} // namespace largo::models
