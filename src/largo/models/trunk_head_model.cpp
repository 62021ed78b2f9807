#include <largo/models/trunk_head_model.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <utility>

namespace largo::models {

TrunkHeadModelImpl::TrunkHeadModelImpl(Trunk trunk, torch::nn::Sequential head)
    : trunk_(register_module("trunk", std::move(trunk.blocks))),
      head_(register_module("head", std::move(head))),
      trunk_output_dim_(trunk.output_dim) {}

void TrunkHeadModelImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_sequential_member(*this, name, replacement, {{"trunk", &trunk_}, {"head", &head_}});
}

at::Tensor TrunkHeadModelImpl::forward(at::Tensor x) {
  return forward_head(forward_trunk(std::move(x)));
}

at::Tensor TrunkHeadModelImpl::forward_trunk(at::Tensor x) {
  return forward_trunk_range(std::move(x), 0, num_trunk_blocks());
}

at::Tensor TrunkHeadModelImpl::forward_trunk_range(at::Tensor x, int64_t begin, int64_t end) {
  const int64_t num_blocks = num_trunk_blocks();
  if (begin < 0 || begin > end || end > num_blocks) {
    throw Error(fmt::format(
        "trunk block range [{}, {}) is not within the model's {} trunk blocks; expected "
        "0 <= begin <= end <= {}",
        begin,
        end,
        num_blocks,
        num_blocks));
  }
  auto first = trunk_->begin() + begin;
  auto last = trunk_->begin() + end;
  for (auto block = first; block != last; ++block) {
    x = block->forward<at::Tensor>(std::move(x));
  }
  return x;
}

at::Tensor TrunkHeadModelImpl::forward_head(at::Tensor features) {
  if (head_->is_empty()) {
    return features;
  }
  return head_->forward(std::move(features));
}

int64_t TrunkHeadModelImpl::num_trunk_blocks() const {
  return static_cast<int64_t>(trunk_->size());
}

std::shared_ptr<torch::nn::Module> TrunkHeadModelImpl::trunk_block(int64_t index) const {
  if (index < 0 || index >= num_trunk_blocks()) {
    throw Error(fmt::format(
        "trunk block {} does not exist; the model has {} trunk blocks (0 to {})",
        index,
        num_trunk_blocks(),
        num_trunk_blocks() - 1));
  }
  // The registered block, not what the trunk runs in its place (an FSDP unit or a checkpointed
  // segment intercepts its forward: parallel/activation_checkpointing/sequential_interception.h).
  return trunk_->named_children()[static_cast<size_t>(index)].value();
}

} // namespace largo::models
