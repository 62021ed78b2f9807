#include <largo/models/moco_model.h>

#include <largo/core/error.h>
#include <largo/models/momentum_copy.h>
#include <largo/models/multi_crop_model.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

namespace largo::models {
namespace {

// Every rank's [n, ...] `local` in rank order: [world * n, ...].
at::Tensor gather_rows(const at::Tensor& local, comm::ProcessGroup& group) {
  const at::Tensor input = local.contiguous();
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape[0] *= group.world_size();
  at::Tensor gathered = at::empty(shape, input.options());
  group.all_gather(gathered, input);
  return gathered;
}

} // namespace

MocoModelImpl::MocoModelImpl(
    const TrunkHeadModel& query,
    TrunkHeadModel momentum_encoder,
    std::vector<std::vector<int64_t>> view_shapes,
    MocoModelOptions options)
    : trunk_(register_module("trunk", query->trunk())),
      head_(register_module("head", query->head())),
      momentum_(std::move(momentum_encoder)),
      view_shapes_(std::move(view_shapes)),
      options_(options) {
  require_option(
      options_.momentum >= 0.0 && options_.momentum <= 1.0,
      "MocoModelOptions::momentum",
      fmt::format("{}", options_.momentum),
      "a number in [0, 1]");
  if (view_shapes_.size() != 2) {
    throw ConfigError(fmt::format(
        "MoCo takes 2 views per image (view 0 for the query, view 1 for the key), got {}; use "
        "ImgReplicatePil with num_times 2",
        view_shapes_.size()));
  }
  freeze_as_copy_of(
      *this,
      *momentum_,
      "the MoCo momentum encoder must have the query encoder's parameters (build both with "
      "the same model options)");
}

std::vector<at::Tensor> MocoModelImpl::unpack(const at::Tensor& packed) const {
  return unpack_views(packed, view_shapes_, "MoCo model");
}

at::Tensor MocoModelImpl::forward(const at::Tensor& packed) {
  const std::vector<at::Tensor> views = unpack(packed);
  if (is_training()) {
    advance_momentum_encoder();
  }
  at::Tensor query = trunk_->forward(views[0]);
  if (!head_->is_empty()) {
    query = head_->forward(query);
  }
  at::Tensor key;
  {
    at::NoGradGuard no_grad;
    momentum_->train(is_training());
    comm::ProcessGroup* group = group_.get();
    const bool shuffle =
        is_training() && options_.shuffle_batch && group != nullptr && group->world_size() > 1;
    key = shuffle ? shuffled_keys(views[1], *group) : keys(views[1]);
  }
  return at::cat({query, key.to(query.scalar_type())}, 1);
}

// VISSL's MoCoHook.on_forward: built (copied) on the first forward, updated on the others.
void MocoModelImpl::advance_momentum_encoder() {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> queries = momentum_copy_sources(
      *this,
      *momentum_,
      whole_query_.empty() ? nullptr : &whole_query_,
      "the MoCo momentum encoder");
  std::vector<at::Tensor> targets = momentum_->parameters();
  if (queries.empty()) {
    ++forwards_;
    return;
  }
  if (targets.front().device() != queries.front().device()) {
    momentum_->to(queries.front().device()); // moves the tensors in `targets` too
  }
  if (forwards_ == 0) {
    at::_foreach_copy_(targets, queries);
  } else {
    // VISSL's p_k * m + p_q * (1 - m), each product rounded before the sum as there (a fused
    // add with alpha would round once and drift from VISSL's sequence).
    at::_foreach_mul_(targets, options_.momentum);
    at::_foreach_add_(targets, at::_foreach_mul(queries, 1.0 - options_.momentum));
  }
  ++forwards_;
}

at::Tensor MocoModelImpl::keys(const at::Tensor& images) {
  const at::Tensor key = momentum_->forward(images);
  return key / key.norm(2, 1, /*keepdim=*/true).clamp_min(1e-12); // F.normalize
}

// VISSL's _batch_shuffle_ddp and _batch_unshuffle_ddp.
at::Tensor MocoModelImpl::shuffled_keys(const at::Tensor& images, comm::ProcessGroup& group) {
  const int64_t n = images.size(0);
  const at::Tensor all_images = gather_rows(images, group); // [world * n, c, h, w]
  const int64_t total = all_images.size(0);
  // This forward's index: advance_momentum_encoder has counted it already.
  const auto forward_index = static_cast<uint64_t>(forwards_ - 1);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.shuffle_seed + forward_index);
  const at::Tensor shuffle = at::randperm(total, generator, at::kLong);
  const at::Tensor unshuffle = at::argsort(shuffle);
  const int64_t rank = group.rank();
  const at::Tensor mine = shuffle.view({group.world_size(), n})[rank].to(images.device());
  const at::Tensor shuffled_keys = keys(all_images.index_select(0, mine)); // [n, d]
  const at::Tensor all_keys = gather_rows(shuffled_keys, group);           // [world * n, d]
  const at::Tensor back = unshuffle.view({group.world_size(), n})[rank].to(images.device());
  return all_keys.index_select(0, back);
}

std::map<std::string, at::Tensor> MocoModelImpl::momentum_state_dict() const {
  std::map<std::string, at::Tensor> state = momentum_copy_state_dict(*momentum_, "moco_encoder.");
  state.emplace("moco_num_forwards", at::tensor({forwards_}, at::kLong));
  return state;
}

void MocoModelImpl::load_momentum_state_dict(const std::map<std::string, at::Tensor>& state) {
  const std::string what = "MoCo momentum encoder";
  load_momentum_copy_state_dict(*momentum_, state, "moco_encoder.", what);
  forwards_ = load_momentum_copy_counter(state, "moco_num_forwards", what);
}

void MocoModelImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_sequential_member(*this, name, replacement, {{"trunk", &trunk_}, {"head", &head_}});
}

} // namespace largo::models
