#include <largo/parallel/tensor_parallel/tensor_parallel.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/autograd.h>

#include <algorithm>

namespace largo::parallel {
namespace {

// The group outlives the backward (the layers own it), so the autograd functions save its
// address; an IValue cannot hold the object itself (as comm/gather_with_gradient.cpp does).
void save_tensor_parallel_group(
    torch::autograd::AutogradContext* context, comm::ProcessGroup* group) {
  context->saved_data["group"] = reinterpret_cast<int64_t>(group);
}

comm::ProcessGroup& saved_tensor_parallel_group(torch::autograd::AutogradContext* context) {
  return *reinterpret_cast<comm::ProcessGroup*>(context->saved_data["group"].toInt());
}

at::Tensor all_reduced_copy(const at::Tensor& tensor, comm::ProcessGroup& group) {
  at::Tensor summed = tensor.contiguous().clone();
  group.all_reduce(summed);
  return summed;
}

class CopyToTensorParallelRegion : public torch::autograd::Function<CopyToTensorParallelRegion> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* context,
      const at::Tensor& input,
      comm::ProcessGroup* group) {
    save_tensor_parallel_group(context, group);
    return input;
  }
  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list gradients) {
    return {all_reduced_copy(gradients[0], saved_tensor_parallel_group(context)), at::Tensor()};
  }
};

class ReduceFromTensorParallelRegion
    : public torch::autograd::Function<ReduceFromTensorParallelRegion> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* /*context*/,
      const at::Tensor& input,
      comm::ProcessGroup* group) {
    return all_reduced_copy(input, *group);
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* /*context*/, torch::autograd::variable_list gradients) {
    return {gradients[0], at::Tensor()};
  }
};

class GatherFromTensorParallelRegion
    : public torch::autograd::Function<GatherFromTensorParallelRegion> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* context,
      const at::Tensor& input,
      comm::ProcessGroup* group) {
    save_tensor_parallel_group(context, group);
    const int64_t local_features = input.size(-1);
    context->saved_data["local_features"] = local_features;
    std::vector<int64_t> shape = input.sizes().vec();
    shape.insert(shape.begin(), group->world_size());
    at::Tensor gathered = at::empty(shape, input.options()); // [T, ..., n]
    group->all_gather(gathered, input.contiguous());
    shape = input.sizes().vec();
    shape.back() = local_features * group->world_size();
    return gathered.movedim(0, -2).reshape(shape); // [..., T, n] -> [..., T * n]
  }
  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list gradients) {
    comm::ProcessGroup& group = saved_tensor_parallel_group(context);
    const int64_t local_features = context->saved_data["local_features"].toInt();
    return {
        gradients[0].narrow(-1, group.rank() * local_features, local_features).contiguous(),
        at::Tensor()};
  }
};

// ---- sequence parallelism: tokens along dim -2, ranks' shards padded to one chunk --------
int64_t sequence_chunk(int64_t length, int world_size) {
  return (length + world_size - 1) / world_size;
}

// Every rank's tokens [..., n_r, d] -> the whole sequence [..., length, d]. Each rank's are
// padded to the chunk size, so that the all-gather moves equal parts.
at::Tensor all_gather_tokens(const at::Tensor& local, comm::ProcessGroup& group, int64_t length) {
  const int world = group.world_size();
  const int64_t chunk = sequence_chunk(length, world);
  const at::Tensor padded = at::constant_pad_nd(local, {0, 0, 0, chunk - local.size(-2)});
  std::vector<int64_t> shape = padded.sizes().vec();
  shape.insert(shape.begin(), world);
  at::Tensor gathered = at::empty(shape, local.options()); // [T, ..., chunk, d]
  group.all_gather(gathered, padded.contiguous());
  shape = padded.sizes().vec();
  shape[shape.size() - 2] = world * chunk;
  // [T, ..., chunk, d] -> [..., T, chunk, d] -> [..., T * chunk, d] -> the real tokens
  return gathered.movedim(0, -3).reshape(shape).narrow(-2, 0, length).contiguous();
}

// The sum over ranks of each rank's [..., length, d], of which this rank keeps its tokens.
at::Tensor reduce_scatter_tokens(const at::Tensor& full, comm::ProcessGroup& group) {
  const int world = group.world_size();
  const int64_t length = full.size(-2);
  const int64_t chunk = sequence_chunk(length, world);
  const at::Tensor padded = at::constant_pad_nd(full, {0, 0, 0, world * chunk - length});
  std::vector<int64_t> shape = padded.sizes().vec();
  shape[shape.size() - 2] = chunk;
  shape.insert(shape.end() - 2, world); // [..., T, chunk, d]
  // reduce_scatter uses its input as scratch: never the caller's tensor.
  at::Tensor scratch = padded.reshape(shape).movedim(-3, 0).contiguous(); // [T, ..., chunk, d]
  if (scratch.data_ptr() == full.data_ptr()) {
    scratch = scratch.clone();
  }
  at::Tensor output = at::empty(scratch.sizes().slice(1), full.options()); // [..., chunk, d]
  group.reduce_scatter(output, scratch);
  const SequenceShard shard = sequence_shard_of(length, group.rank(), world);
  return output.narrow(-2, 0, shard.size).contiguous();
}

at::Tensor tokens_of_rank(const at::Tensor& full, comm::ProcessGroup& group) {
  const SequenceShard shard = sequence_shard_of(full.size(-2), group.rank(), group.world_size());
  return full.narrow(-2, shard.begin, shard.size).clone(at::MemoryFormat::Contiguous);
}

// A region that keeps this rank's tokens of the sequence `keep` gives it (its slice of the
// same sequence, or its tokens of the ranks' summed partial sequences); backward gathers
// every rank's tokens' gradients.
template <at::Tensor (*keep)(const at::Tensor&, comm::ProcessGroup&)>
class KeepTokensOfRank : public torch::autograd::Function<KeepTokensOfRank<keep>> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* context,
      const at::Tensor& input,
      comm::ProcessGroup* group) {
    save_tensor_parallel_group(context, group);
    context->saved_data["length"] = input.size(-2);
    return keep(input, *group);
  }
  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list gradients) {
    return {
        all_gather_tokens(
            gradients[0],
            saved_tensor_parallel_group(context),
            context->saved_data["length"].toInt()),
        at::Tensor()};
  }
};
using ScatterToSequenceParallelRegion = KeepTokensOfRank<tokens_of_rank>;
using ReduceScatterToSequenceParallelRegion = KeepTokensOfRank<reduce_scatter_tokens>;

class GatherFromSequenceParallelRegion
    : public torch::autograd::Function<GatherFromSequenceParallelRegion> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* context,
      const at::Tensor& input,
      comm::ProcessGroup* group,
      int64_t length) {
    save_tensor_parallel_group(context, group);
    return all_gather_tokens(input, *group, length);
  }
  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list gradients) {
    return {
        tokens_of_rank(gradients[0], saved_tensor_parallel_group(context)),
        at::Tensor(),
        at::Tensor()};
  }
};

// A column-parallel product of sequence-parallel input: all-gather this rank's tokens, then
// multiply by the weight (the caller adds the bias). Saved for backward are this rank's
// tokens, not the gathered sequence, which is gathered again (Megatron-LM's
// sequence-parallel Linear): T times less activation memory for one more all-gather in
// backward. Backward runs in the gradient's dtype (an autocast forward computed in it) and
// gives each gradient its tensor's dtype.
class SequenceGatheredLinear : public torch::autograd::Function<SequenceGatheredLinear> {
 public:
  static at::Tensor forward(
      torch::autograd::AutogradContext* context,
      const at::Tensor& input,
      const at::Tensor& weight,
      comm::ProcessGroup* group,
      int64_t length) {
    save_tensor_parallel_group(context, group);
    context->saved_data["length"] = length;
    context->save_for_backward({input, weight});
    return at::linear(all_gather_tokens(input, *group, length), weight);
  }
  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext* context, torch::autograd::variable_list gradients) {
    comm::ProcessGroup& group = saved_tensor_parallel_group(context);
    const auto saved = context->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& grad = gradients[0]; // [..., length, out/T]
    const at::ScalarType dtype = grad.scalar_type();
    const at::Tensor full =
        all_gather_tokens(input, group, context->saved_data["length"].toInt()).to(dtype);
    const at::Tensor grad_full_input = at::matmul(grad, weight.to(dtype));
    const at::Tensor grad_input = reduce_scatter_tokens(grad_full_input, group).to(input.dtype());
    const at::Tensor rows = grad.reshape({-1, grad.size(-1)});
    const at::Tensor grad_weight =
        rows.t().mm(full.reshape({-1, full.size(-1)})).to(weight.dtype());
    return {grad_input, grad_weight, at::Tensor(), at::Tensor()};
  }
};

// The shape in which a tensor's dim `spec.dim` reads [num_blocks, T, part]: the sizes before
// the dim, num_blocks, T, part, the sizes after.
std::vector<int64_t>
blocked_shape(at::IntArrayRef sizes, TensorParallelShardSpec spec, int64_t world_size) {
  std::vector<int64_t> shape(sizes.begin(), sizes.begin() + spec.dim);
  const int64_t part = sizes[spec.dim] / (spec.num_blocks * world_size);
  shape.insert(shape.end(), {spec.num_blocks, world_size, part});
  shape.insert(shape.end(), sizes.begin() + spec.dim + 1, sizes.end());
  return shape;
}

// This rank's weight and bias from a full Linear, as parameters of `module`.
void register_linear_shard(
    torch::nn::Module& module,
    const torch::nn::LinearImpl& full,
    TensorParallelShardSpec weight_spec,
    bool shard_bias,
    const comm::ProcessGroup& group,
    at::Tensor& weight,
    at::Tensor& bias) {
  torch::NoGradGuard no_grad;
  const int rank = group.rank();
  const int world = group.world_size();
  weight =
      module.register_parameter("weight", shard_of(full.weight.detach(), weight_spec, rank, world));
  if (full.bias.defined()) {
    at::Tensor local_bias =
        shard_bias ? shard_of(full.bias.detach(), {0, weight_spec.num_blocks}, rank, world)
                   : full.bias.detach().clone();
    bias = module.register_parameter("bias", local_bias);
  }
}

} // namespace

at::Tensor copy_to_tensor_parallel_region(const at::Tensor& input, comm::ProcessGroup& group) {
  return group.world_size() == 1 ? input : CopyToTensorParallelRegion::apply(input, &group);
}

at::Tensor reduce_from_tensor_parallel_region(const at::Tensor& input, comm::ProcessGroup& group) {
  return group.world_size() == 1 ? input : ReduceFromTensorParallelRegion::apply(input, &group);
}

at::Tensor gather_from_tensor_parallel_region(const at::Tensor& input, comm::ProcessGroup& group) {
  return group.world_size() == 1 ? input : GatherFromTensorParallelRegion::apply(input, &group);
}

SequenceShard sequence_shard_of(int64_t length, int rank, int world_size) {
  const int64_t chunk = sequence_chunk(length, world_size);
  const int64_t begin = std::min<int64_t>(rank * chunk, length);
  return {begin, std::min(chunk, length - begin)};
}

at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& input, comm::ProcessGroup& group) {
  return group.world_size() == 1 ? input : ScatterToSequenceParallelRegion::apply(input, &group);
}

at::Tensor gather_from_sequence_parallel_region(
    const at::Tensor& input, comm::ProcessGroup& group, int64_t length) {
  return group.world_size() == 1 ? input
                                 : GatherFromSequenceParallelRegion::apply(input, &group, length);
}

at::Tensor
reduce_scatter_to_sequence_parallel_region(const at::Tensor& input, comm::ProcessGroup& group) {
  return group.world_size() == 1 ? input
                                 : ReduceScatterToSequenceParallelRegion::apply(input, &group);
}

at::Tensor
shard_of(const at::Tensor& full, TensorParallelShardSpec spec, int rank, int world_size) {
  if (spec.dim < 0 || spec.dim >= full.dim() || spec.num_blocks < 1) {
    throw OptionError(
        "TensorParallelShardSpec",
        fmt::format("{{dim {}, num_blocks {}}}", spec.dim, spec.num_blocks),
        fmt::format("a dim of the {}-d tensor and num_blocks >= 1", full.dim()));
  }
  const int64_t size = full.size(spec.dim);
  if (size % (spec.num_blocks * world_size) != 0) {
    throw OptionError(
        fmt::format("size of dim {} of a tensor parallel shard", spec.dim),
        std::to_string(size),
        fmt::format(
            "a multiple of num_blocks {} * tensor-parallel size {}", spec.num_blocks, world_size));
  }
  std::vector<int64_t> local_shape = full.sizes().vec();
  local_shape[spec.dim] = size / world_size;
  return full.reshape(blocked_shape(full.sizes(), spec, world_size))
      .select(spec.dim + 1, rank)
      .reshape(local_shape)
      .clone(at::MemoryFormat::Contiguous);
}

at::Tensor
unshard(const at::Tensor& local, TensorParallelShardSpec spec, comm::ProcessGroup& group) {
  const int64_t world = group.world_size();
  if (world == 1) {
    return local.detach().clone();
  }
  std::vector<int64_t> gathered_shape = local.sizes().vec();
  gathered_shape.insert(gathered_shape.begin(), world);
  at::Tensor gathered = at::empty(gathered_shape, local.options()); // [T, local...]
  group.all_gather(gathered, local.detach().contiguous());
  std::vector<int64_t> full_shape = local.sizes().vec();
  full_shape[spec.dim] *= world;
  // [T, before, blocks, part, after] -> [before, blocks, T, part, after] -> full
  std::vector<int64_t> view_shape = blocked_shape(full_shape, spec, world);
  view_shape.erase(view_shape.begin() + spec.dim + 1); // drop T: it is gathered's dim 0
  view_shape.insert(view_shape.begin(), world);
  return gathered.reshape(view_shape).movedim(0, spec.dim + 1).reshape(full_shape);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(
    const torch::nn::LinearImpl& full,
    std::shared_ptr<comm::ProcessGroup> tp_group,
    ColumnParallelLinearOptions options)
    : tp_group_(std::move(tp_group)), options_(options) {
  if (options.gather_output && options.num_output_blocks != 1) {
    throw OptionError(
        "ColumnParallelLinearOptions::num_output_blocks",
        std::to_string(options.num_output_blocks),
        "1 with gather_output = true (the gathered output would be in rank-major order)");
  }
  if (options.sequence_length < 0 || (options.gather_output && options.sequence_length > 0)) {
    throw OptionError(
        "ColumnParallelLinearOptions::sequence_length",
        std::to_string(options.sequence_length),
        "0, or > 0 without gather_output (sequence parallelism ends in a row-parallel layer)");
  }
  register_linear_shard(
      *this, full, {0, options.num_output_blocks}, /*shard_bias=*/true, *tp_group_, weight, bias);
}

at::Tensor
ColumnParallelLinearImpl::local_product(const at::Tensor& input, const at::Tensor& with_bias) {
  // The product needs every token: gathered under sequence parallelism, whose backward then
  // sums the ranks' gradients of the input (a reduce-scatter) as the copy region's
  // all-reduce does.
  if (options_.sequence_length > 0 && tp_group_->world_size() > 1) {
    at::Tensor output =
        SequenceGatheredLinear::apply(input, weight, tp_group_.get(), options_.sequence_length);
    return with_bias.defined() ? output + with_bias : output;
  }
  return at::linear(copy_to_tensor_parallel_region(input, *tp_group_), weight, with_bias);
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  at::Tensor output = local_product(input, bias);
  return options_.gather_output ? gather_from_tensor_parallel_region(output, *tp_group_) : output;
}

at::Tensor ColumnParallelLinearImpl::forward_without_bias(const at::Tensor& input) {
  if (options_.gather_output) {
    throw Error(
        "ColumnParallelLinear::forward_without_bias: the layer gathers its output "
        "(ColumnParallelLinearOptions::gather_output), so its bias cannot be added after it");
  }
  return local_product(input, at::Tensor());
}

std::map<std::string, TensorParallelShardSpec>
ColumnParallelLinearImpl::sharded_parameters() const {
  std::map<std::string, TensorParallelShardSpec> specs{{"weight", {0, options_.num_output_blocks}}};
  if (bias.defined()) {
    specs["bias"] = {0, options_.num_output_blocks};
  }
  return specs;
}

RowParallelLinearImpl::RowParallelLinearImpl(
    const torch::nn::LinearImpl& full,
    std::shared_ptr<comm::ProcessGroup> tp_group,
    RowParallelLinearOptions options)
    : tp_group_(std::move(tp_group)), options_(options) {
  register_linear_shard(*this, full, {1, 1}, /*shard_bias=*/false, *tp_group_, weight, bias);
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  // The bias is added after the sum over ranks: added to each rank's partial product it
  // would be counted T times.
  const at::Tensor partial = at::linear(input, weight);
  if (!options_.scatter_sequence) {
    const at::Tensor output = reduce_from_tensor_parallel_region(partial, *tp_group_);
    return bias.defined() ? output + bias : output;
  }
  // This rank's tokens: the bias's gradient covers those only, so it is summed over ranks.
  const at::Tensor output = reduce_scatter_to_sequence_parallel_region(partial, *tp_group_);
  return bias.defined() ? output + copy_to_tensor_parallel_region(bias, *tp_group_) : output;
}

std::map<std::string, TensorParallelShardSpec> RowParallelLinearImpl::sharded_parameters() const {
  return {{"weight", {1, 1}}};
}

std::map<std::string, TensorParallelShardSpec>
tensor_parallel_sharded_parameters(const torch::nn::Module& model) {
  std::map<std::string, TensorParallelShardSpec> specs;
  auto add = [&specs](const torch::nn::Module& module, const std::string& prefix) {
    if (const auto* sharded = dynamic_cast<const TensorParallelModule*>(&module)) {
      for (const auto& [name, spec] : sharded->sharded_parameters()) {
        specs[prefix + name] = spec;
      }
    }
  };
  add(model, "");
  // Without the root (include_self), which need not be owned by a shared_ptr.
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    add(*item.value(), item.key() + ".");
  }
  return specs;
}

at::Tensor full_parameter(
    const torch::nn::Module& model, const std::string& name, comm::ProcessGroup& tp_group) {
  const auto parameters = model.named_parameters();
  const at::Tensor* local = parameters.find(name);
  if (local == nullptr) {
    throw Error(fmt::format("full_parameter: the model has no parameter named \"{}\"", name));
  }
  const auto specs = tensor_parallel_sharded_parameters(model);
  const auto spec = specs.find(name);
  return spec == specs.end() ? local->detach().clone() : unshard(*local, spec->second, tp_group);
}

std::vector<std::pair<std::string, at::Tensor>>
full_parameters(const torch::nn::Module& model, comm::ProcessGroup& tp_group) {
  const auto specs = tensor_parallel_sharded_parameters(model);
  std::vector<std::pair<std::string, at::Tensor>> full;
  for (const auto& item : model.named_parameters()) {
    const auto spec = specs.find(item.key());
    full.emplace_back(
        item.key(),
        spec == specs.end() ? item.value().detach().clone()
                            : unshard(item.value(), spec->second, tp_group));
  }
  return full;
}

} // namespace largo::parallel
