#include <largo/parallel/data_parallel/sharded_optimizer.h>

#include <largo/core/error.h>
#include <largo/optim/grad_clipping.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <unordered_map>

namespace largo::parallel {

ShardedOptimizer::ShardedOptimizer(std::vector<optim::ParamGroup> param_groups,
                                   std::shared_ptr<comm::ProcessGroup> group,
                                   ShardedOptimizerOptions options)
    : optim::Optimizer(std::move(param_groups)), group_(std::move(group)) {
  if (!options.make_base_optimizer) {
    throw ConfigError("ZeRO: the sharded optimizer needs a base optimizer "
                      "(ShardedOptimizerOptions::make_base_optimizer)");
  }
  TORCH_CHECK(group_ != nullptr, "ShardedOptimizer needs a process group");
  const int rank = group_->rank();
  const int world_size = group_->world_size();

  // Parameters grouped by (dtype, device) into flat buffers, in group order.
  std::map<std::pair<at::ScalarType, std::string>, size_t> buffer_of;
  std::unordered_map<std::string, std::pair<size_t, size_t>> where; // name -> (buffer, index)
  for (const optim::ParamGroup& param_group : optim::Optimizer::param_groups()) {
    for (size_t i = 0; i < param_group.params.size(); ++i) {
      const at::Tensor& param = param_group.params[i];
      auto key = std::make_pair(param.scalar_type(), param.device().str());
      auto [it, inserted] = buffer_of.emplace(key, buffers_.size());
      if (inserted) {
        buffers_.emplace_back();
      }
      FlatBuffer& buffer = buffers_[it->second];
      where[param_group.names[i]] = {it->second, buffer.tensors.size()};
      buffer.names.push_back(param_group.names[i]);
      buffer.tensors.push_back(param);
    }
  }
  torch::NoGradGuard no_grad;
  for (FlatBuffer& buffer : buffers_) {
    std::vector<int64_t> numels;
    for (const at::Tensor& tensor : buffer.tensors) {
      numels.push_back(tensor.numel());
    }
    buffer.layout = FlatLayout(numels, world_size);
    buffer.params = at::zeros({buffer.layout.padded_numel()}, buffer.tensors.front().options());
    for (size_t i = 0; i < buffer.tensors.size(); ++i) {
      at::Tensor& tensor = buffer.tensors[i];
      at::Tensor view =
          buffer.params.narrow(0, buffer.layout.offset(i), tensor.numel()).view(tensor.sizes());
      view.copy_(tensor);
      tensor.set_data(view);
    }
    buffer.pieces = buffer.layout.pieces_of_rank(rank);
    for (const ShardPiece& piece : buffer.pieces) {
      buffer.piece_params.push_back(buffer.params.narrow(0, piece.flat_offset, piece.numel));
    }
  }

  // The base optimizer's groups: the same groups over this rank's pieces.
  std::vector<optim::ParamGroup> base_groups;
  for (const optim::ParamGroup& param_group : optim::Optimizer::param_groups()) {
    optim::ParamGroup base_group;
    base_group.name = param_group.name;
    base_group.lr = param_group.lr;
    base_group.weight_decay = param_group.weight_decay;
    for (const std::string& name : param_group.names) {
      auto [b, index] = where.at(name);
      const FlatBuffer& buffer = buffers_[b];
      for (size_t p = 0; p < buffer.pieces.size(); ++p) {
        if (buffer.pieces[p].tensor_index == index) {
          base_group.params.push_back(buffer.piece_params[p]);
          base_group.names.push_back(name);
        }
      }
    }
    base_groups.push_back(std::move(base_group));
  }
  // Per-parameter norms (LARC, LAMB) from partial sums: each rank's pieces contribute to
  // their parameters' entries of one global vector, which one all-reduce completes.
  std::unordered_map<std::string, int64_t> global_index;
  for (const optim::ParamGroup& param_group : optim::Optimizer::param_groups()) {
    for (const std::string& name : param_group.names) {
      global_index.emplace(name, static_cast<int64_t>(global_index.size()));
    }
  }
  std::vector<int64_t> piece_to_param;
  for (const optim::ParamGroup& base_group : base_groups) {
    for (const std::string& name : base_group.names) {
      piece_to_param.push_back(global_index.at(name));
    }
  }
  base_ = options.make_base_optimizer(std::move(base_groups));
  base_->set_norm_reducer(complete_norms(
      make_piece_norm_reducer(
          group_, std::move(piece_to_param), static_cast<int64_t>(global_index.size())),
      options.complete_parameter_norms,
      base_->param_groups()));
}

// The base optimizer passes its per-piece partials as [2 * P] (optimizer.h: P parameter
// entries, then P gradient or update entries, for its P pieces in group order). Each block
// is scattered into a [N] vector over all N parameters, one all-reduce completes both, and
// every piece reads its parameter's total back. Ranks holding no piece take part too.
optim::PartialNormReducer make_piece_norm_reducer(std::shared_ptr<comm::ProcessGroup> group,
                                                  std::vector<int64_t> piece_to_param,
                                                  int64_t num_params) {
  constexpr int64_t kBlocks = 2;
  auto index = at::tensor(piece_to_param, at::kLong);
  return [group, index, num_params](const at::Tensor& partials, optim::NormReduceOp op) {
    const int64_t num_pieces = index.numel();
    TORCH_CHECK(partials.numel() == kBlocks * num_pieces,
                "ZeRO norm reducer: expected 2 partials per piece, got ", partials.numel(),
                " for ", num_pieces, " pieces");
    at::Tensor positions = index.to(partials.device());
    at::Tensor global = at::zeros({kBlocks, num_params}, partials.options());
    at::Tensor local = partials.view({kBlocks, num_pieces});
    for (int64_t b = 0; b < kBlocks; ++b) {
      global[b].index_put_({positions}, local[b]);
    }
    group->all_reduce(global, op == optim::NormReduceOp::sum ? comm::ReduceOp::kSum
                                                             : comm::ReduceOp::kMax);
    return global.index({torch::indexing::Slice(), positions}).reshape({-1});
  };
}

optim::PartialNormReducer complete_norms(
    optim::PartialNormReducer over_ranks,
    const ParameterNormCompletion& completion,
    const std::vector<optim::ParamGroup>& piece_groups) {
  if (!completion) {
    return over_ranks;
  }
  return [over_ranks,
          further = completion(piece_groups)](const at::Tensor& partials, optim::NormReduceOp op) {
    return further(over_ranks(partials, op), op);
  };
}

void ShardedOptimizer::use_gradient_shards() {
  gradient_shards_ = true;
  for (FlatBuffer& buffer : buffers_) {
    buffer.grad_shard = at::zeros({buffer.layout.shard_numel()}, buffer.params.options());
  }
}

void ShardedOptimizer::attach_piece_gradients() {
  const int64_t rank = group_->rank();
  for (FlatBuffer& buffer : buffers_) {
    const int64_t shard_begin = rank * buffer.layout.shard_numel();
    for (size_t p = 0; p < buffer.pieces.size(); ++p) {
      const ShardPiece& piece = buffer.pieces[p];
      at::Tensor& piece_grad = buffer.piece_params[p].mutable_grad();
      if (dropped_.count(buffer.names[piece.tensor_index]) != 0) {
        piece_grad = at::Tensor();
        continue;
      }
      if (gradient_shards_) {
        piece_grad = buffer.grad_shard.narrow(0, piece.flat_offset - shard_begin, piece.numel);
        continue;
      }
      const at::Tensor& grad = buffer.tensors[piece.tensor_index].grad();
      piece_grad = grad.defined() ? grad.reshape({-1}).narrow(0, piece.tensor_offset, piece.numel)
                                  : at::Tensor();
    }
  }
}

std::vector<at::Tensor> ShardedOptimizer::shard_gradients() {
  attach_piece_gradients();
  std::vector<at::Tensor> grads;
  for (const FlatBuffer& buffer : buffers_) {
    for (const at::Tensor& piece : buffer.piece_params) {
      if (piece.grad().defined()) {
        grads.push_back(piece.grad());
      }
    }
  }
  return grads;
}

std::vector<at::Tensor> ShardedOptimizer::shard_parameters() {
  attach_piece_gradients();
  std::vector<at::Tensor> pieces;
  for (const FlatBuffer& buffer : buffers_) {
    pieces.insert(pieces.end(), buffer.piece_params.begin(), buffer.piece_params.end());
  }
  return pieces;
}

void ShardedOptimizer::step() {
  // The schedule sets lr on this optimizer's groups; the base optimizer's groups follow.
  auto& groups = param_groups();
  auto& base_groups = base_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    base_groups[g].lr = groups[g].lr;
    base_groups[g].weight_decay = groups[g].weight_decay;
  }
  attach_piece_gradients();
  base_->step();
  torch::NoGradGuard no_grad;
  for (FlatBuffer& buffer : buffers_) {
    const int64_t shard = buffer.layout.shard_numel();
    // In place: this rank's part is the all-gather's input.
    group_->all_gather(buffer.params, buffer.params.narrow(0, group_->rank() * shard, shard));
  }
}

void ShardedOptimizer::drop_gradients(const std::set<std::string>& names) {
  dropped_.insert(names.begin(), names.end());
  attach_piece_gradients();
}

void ShardedOptimizer::zero_grad(bool set_to_none) {
  dropped_.clear();
  optim::Optimizer::zero_grad(set_to_none);
  for (FlatBuffer& buffer : buffers_) {
    if (buffer.grad_shard.defined()) {
      buffer.grad_shard.zero_();
    }
  }
}

double ShardedOptimizer::clip_grad_norm(double max_norm, double norm_type) {
  return clip_grad_norm_of_pieces(shard_parameters(), *group_, max_norm, norm_type);
}

double clip_grad_norm_of_pieces(const std::vector<at::Tensor>& pieces,
                                comm::ProcessGroup& group, double max_norm, double norm_type) {
  // The pieces of all ranks tile every parameter once (the padding is left out), so the
  // partial sums (or maxima) complete to the norm of the whole gradient.
  return optim::clip_grad_norm(
      pieces, max_norm, norm_type, [&group](const at::Tensor& partial, optim::NormReduceOp op) {
        at::Tensor total = partial.clone();
        group.all_reduce(total, op == optim::NormReduceOp::sum ? comm::ReduceOp::kSum
                                                               : comm::ReduceOp::kMax);
        return total;
      });
}

std::vector<std::pair<std::string, at::Tensor>> ShardedOptimizer::named_shard_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> pieces;
  for (const FlatBuffer& buffer : buffers_) {
    for (size_t p = 0; p < buffer.pieces.size(); ++p) {
      pieces.emplace_back(buffer.names[buffer.pieces[p].tensor_index], buffer.piece_params[p]);
    }
  }
  return pieces;
}

std::map<std::string, std::pair<int64_t, int64_t>> ShardedOptimizer::piece_ranges() const {
  std::map<std::string, std::pair<int64_t, int64_t>> ranges;
  for (const FlatBuffer& buffer : buffers_) {
    for (const ShardPiece& piece : buffer.pieces) {
      ranges[buffer.names[piece.tensor_index]] = {piece.tensor_offset, piece.numel};
    }
  }
  return ranges;
}

PieceOwnership ShardedOptimizer::piece_ownership() const {
  PieceOwnership ownership;
  ownership.rank = group_->rank();
  ownership.world_size = group_->world_size();
  ownership.ranges = piece_ranges();
  for (const optim::ParamGroup& param_group : param_groups()) {
    ownership.group_names.push_back(param_group.names);
  }
  return ownership;
}

c10::IValue ShardedOptimizer::state_dict() const {
  return piece_state_dict(*base_, piece_ownership(), type());
}

void ShardedOptimizer::load_state_dict(const c10::IValue& state_dict) {
  load_piece_state_dict(*base_, piece_ownership(), state_dict);
}

void ShardedOptimizer::load_whole_state_dict(const c10::IValue& whole) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const optim::ParamGroup& param_group : param_groups()) {
    for (size_t i = 0; i < param_group.params.size(); ++i) {
      shapes[param_group.names.at(i)] = param_group.params[i].sizes().vec();
    }
  }
  load_resharded_state(1, [&](int) { return whole_state_as_single_shard(whole, shapes); });
}

void ShardedOptimizer::load_resharded_state(
    int old_world_size, const std::function<c10::IValue(int old_rank)>& shards) {
  load_resharded_piece_state(*base_, piece_ownership(), old_world_size, shards);
}

int64_t ShardedOptimizer::state_bytes() const {
  return base_->state_bytes();
}

int64_t ShardedOptimizer::parameter_bytes() const {
  int64_t bytes = 0;
  for (const FlatBuffer& buffer : buffers_) {
    bytes += buffer.params.numel() * static_cast<int64_t>(buffer.params.element_size());
  }
  return bytes;
}

int64_t ShardedOptimizer::gradient_shard_bytes() const {
  int64_t bytes = 0;
  for (const FlatBuffer& buffer : buffers_) {
    if (buffer.grad_shard.defined()) {
      bytes += buffer.grad_shard.numel() * static_cast<int64_t>(buffer.grad_shard.element_size());
    }
  }
  return bytes;
}

} // namespace largo::parallel
