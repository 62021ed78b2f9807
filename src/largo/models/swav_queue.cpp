#include <largo/models/swav_queue.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace largo::models {
namespace {

void validate(const SwavQueueOptions& o) {
  require_option(o.length > 0, "SwavQueueOptions::length", std::to_string(o.length), "> 0");
  require_option(
      o.start_iter >= 0, "SwavQueueOptions::start_iter", std::to_string(o.start_iter), ">= 0");
  require_option(
      o.embedding_dim > 0,
      "SwavQueueOptions::embedding_dim",
      std::to_string(o.embedding_dim),
      "> 0");
  require_option(
      !o.num_prototypes.empty() &&
          std::all_of(
              o.num_prototypes.begin(), o.num_prototypes.end(), [](int64_t k) { return k > 0; }),
      "SwavQueueOptions::num_prototypes",
      fmt::format("[{}]", fmt::join(o.num_prototypes, ", ")),
      "one cluster count > 0 per prototype set");
  const bool crops_ok =
      !o.crops_for_assign.empty() &&
      std::all_of(o.crops_for_assign.begin(), o.crops_for_assign.end(), [&](int64_t c) {
        return c >= 0 && c < o.num_crops;
      });
  require_option(
      crops_ok,
      "SwavQueueOptions::crops_for_assign",
      fmt::format("[{}]", fmt::join(o.crops_for_assign, ", ")),
      fmt::format("crop indices in [0, SwavQueueOptions::num_crops = {})", o.num_crops));
}

void require_shape(
    const std::map<std::string, at::Tensor>& state,
    const std::string& name,
    at::IntArrayRef shape) {
  auto it = state.find(name);
  if (it == state.end() || it->second.sizes() != shape) {
    throw CheckpointError(fmt::format(
        "SwAV queue state: {} {}; expected a tensor of shape [{}] (queue_length, crops_for_assign "
        "and the prototypes must be those of the run that saved it)",
        name,
        it == state.end() ? std::string("is missing")
                          : fmt::format("has shape [{}]", fmt::join(it->second.sizes(), ", ")),
        fmt::join(shape, ", ")));
  }
}

// A copy on the CPU, never sharing storage with the queue (which keeps changing).
at::Tensor cpu_copy(const at::Tensor& tensor) {
  return tensor.is_cpu() ? tensor.clone() : tensor.cpu();
}

} // namespace

SwavQueue::SwavQueue(SwavQueueOptions options, at::Generator generator, c10::Device device)
    : options_(std::move(options)) {
  validate(options_);
  const auto crops = static_cast<int64_t>(options_.crops_for_assign.size());
  for (int64_t k : options_.num_prototypes) {
    scores_.push_back((at::rand({crops, options_.length, k}, generator) * 2 - 1).to(device));
  }
  const double stdv = 1.0 / std::sqrt(static_cast<double>(options_.embedding_dim) / 3.0);
  embeddings_ = at::rand({crops, options_.length, options_.embedding_dim}, generator)
                    .mul_(2 * stdv)
                    .add_(-stdv)
                    .to(device);
}

void SwavQueue::rescore(SwavHeadImpl& head) {
  TORCH_CHECK(
      head.prototypes().size() == scores_.size(),
      "SwavQueue::rescore: the head has ",
      head.prototypes().size(),
      " prototype sets, the queue ",
      scores_.size());
  at::NoGradGuard no_grad;
  for (size_t j = 0; j < scores_.size(); ++j) {
    torch::nn::Linear prototypes = head.prototypes()[j]; // a handle: shares the module
    // FSDP's compute copies (O2) hold the prototypes in a lower dtype than the stored
    // float32 embeddings: score in theirs, as VISSL's FSDP casts the hook's input.
    const auto dtype = prototypes->weight.scalar_type();
    for (int64_t crop = 0; crop < embeddings_.size(0); ++crop) {
      scores_[j][crop].copy_(prototypes->forward(embeddings_[crop].to(dtype)));
    }
  }
}

std::vector<at::Tensor> SwavQueue::scores(size_t set) const {
  TORCH_CHECK(set < scores_.size(), "SwavQueue::scores: no prototype set ", set);
  return scores_[set].unbind(0);
}

void SwavQueue::push(const at::Tensor& embeddings) {
  const int64_t n = embeddings.size(0) / options_.num_crops;
  TORCH_CHECK(
      embeddings.dim() == 2 && embeddings.size(0) == n * options_.num_crops &&
          embeddings.size(1) == options_.embedding_dim && n <= options_.length,
      "SwavQueue::push: expected [num_crops * n, ",
      options_.embedding_dim,
      "] with n <= ",
      options_.length,
      ", got ",
      embeddings.sizes());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < options_.crops_for_assign.size(); ++i) {
    at::Tensor queue = embeddings_[static_cast<int64_t>(i)];
    queue.narrow(0, n, options_.length - n).copy_(queue.narrow(0, 0, options_.length - n).clone());
    queue.narrow(0, 0, n).copy_(embeddings.narrow(0, options_.crops_for_assign[i] * n, n));
  }
}

std::map<std::string, at::Tensor> SwavQueue::state_dict() const {
  std::map<std::string, at::Tensor> state;
  for (size_t j = 0; j < scores_.size(); ++j) {
    state.emplace(fmt::format("local_queue{}", j), cpu_copy(scores_[j]));
  }
  state.emplace("local_emb_queue", cpu_copy(embeddings_));
  return state;
}

void SwavQueue::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  for (size_t j = 0; j < scores_.size(); ++j) {
    require_shape(state, fmt::format("local_queue{}", j), scores_[j].sizes());
  }
  require_shape(state, "local_emb_queue", embeddings_.sizes());
  for (size_t j = 0; j < scores_.size(); ++j) {
    scores_[j].copy_(state.at(fmt::format("local_queue{}", j)));
  }
  embeddings_.copy_(state.at("local_emb_queue"));
}

} // namespace largo::models
