#include <largo/parallel/tensor_parallel/tensor_parallel_plan.h>

#include <largo/core/error.h>
#include <largo/models/mlp.h>
#include <largo/models/vit.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/container/sequential.h>

#include <cmath>
#include <map>
#include <set>

namespace largo::parallel {
namespace {

struct VitLayerTarget {
  std::string name;
  models::VitEncoderLayerImpl* layer;
};

// Consecutive encoder layers of one Sequential: under sequence parallelism their tokens are
// split before the first and gathered after the last, and in between every layer holds this
// rank's tokens of a sequence of `num_tokens` (what the patch embedding before them gives).
struct SequenceRun {
  std::vector<VitLayerTarget> layers;
  int64_t num_tokens = 0; // 0: no models::VitPatchEmbedding right before the first layer
};

// Two consecutive MLP blocks: `column` splits its output features, `row` its input features.
struct MlpPairTarget {
  std::string column_name;
  models::MlpBlockImpl* column;
  std::string row_name;
  models::MlpBlockImpl* row;
};

struct TensorParallelTargets {
  std::vector<VitLayerTarget> vit_layers;
  std::vector<MlpPairTarget> mlp_pairs;
  std::vector<SequenceRun> sequence_runs;
};

std::string child_name(const std::string& parent, const std::string& child) {
  return parent.empty() ? child : parent + "." + child;
}

// The child `name` of `module` when it is a full torch::nn::Linear, else nullptr.
torch::nn::LinearImpl* linear_child(const torch::nn::Module& module, const std::string& name) {
  const auto children = module.named_children();
  const auto* child = children.find(name);
  return child == nullptr ? nullptr : dynamic_cast<torch::nn::LinearImpl*>(child->get());
}

// Every module of `model` with its name, the root first (named "").
std::vector<std::pair<std::string, torch::nn::Module*>> all_modules(torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"", &model}};
  // Without include_self: the root need not be owned by a shared_ptr.
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    modules.emplace_back(item.key(), item.value().get());
  }
  return modules;
}

// Runs of consecutive Linear MlpBlocks among the children of a Sequential, in pairs.
void collect_mlp_pairs(
    const std::string& prefix,
    const torch::nn::SequentialImpl& sequential,
    std::vector<MlpPairTarget>& pairs) {
  std::string pending_name;
  models::MlpBlockImpl* pending = nullptr;
  for (const auto& item : sequential.named_children()) {
    auto* block = dynamic_cast<models::MlpBlockImpl*>(item.value().get());
    if (block == nullptr || linear_child(*block, "linear") == nullptr) {
      pending = nullptr; // a pair is two adjacent blocks
      continue;
    }
    if (pending == nullptr) {
      pending = block;
      pending_name = child_name(prefix, item.key());
      continue;
    }
    pairs.push_back({pending_name, pending, child_name(prefix, item.key()), block});
    pending = nullptr;
  }
}

// Runs of consecutive VitEncoderLayers among the children of a Sequential.
void collect_sequence_runs(
    const std::string& prefix,
    const torch::nn::SequentialImpl& sequential,
    std::vector<SequenceRun>& runs) {
  const torch::nn::Module* previous = nullptr;
  bool in_run = false;
  for (const auto& item : sequential.named_children()) {
    auto* layer = dynamic_cast<models::VitEncoderLayerImpl*>(item.value().get());
    if (layer == nullptr) {
      in_run = false;
    } else {
      if (!in_run) {
        const auto* embedding = dynamic_cast<const models::VitPatchEmbeddingImpl*>(previous);
        runs.push_back({{}, embedding == nullptr ? 0 : embedding->num_tokens()});
        in_run = true;
      }
      runs.back().layers.push_back({child_name(prefix, item.key()), layer});
    }
    previous = item.value().get();
  }
}

TensorParallelTargets find_targets(torch::nn::Module& model) {
  TensorParallelTargets targets;
  for (const auto& [name, module] : all_modules(model)) {
    if (auto* layer = dynamic_cast<models::VitEncoderLayerImpl*>(module)) {
      targets.vit_layers.push_back({name, layer});
    } else if (const auto* sequential = dynamic_cast<const torch::nn::SequentialImpl*>(module)) {
      collect_mlp_pairs(name, *sequential, targets.mlp_pairs);
      collect_sequence_runs(name, *sequential, targets.sequence_runs);
    }
  }
  return targets;
}

// Sequence parallelism splits the tokens of every ViT layer's run, and so needs each run's
// token count and at least one token per rank.
void check_sequence_parallel_plan(const TensorParallelTargets& targets, int64_t tp_size) {
  const std::string option = "TensorParallelPlanOptions::sequence_parallel";
  if (targets.vit_layers.empty()) {
    throw OptionError(
        option,
        "true",
        "false for a model without models::VitEncoderLayer layers (the MLP trunk has no "
        "sequence of tokens to split)");
  }
  size_t layers_in_runs = 0;
  for (const SequenceRun& run : targets.sequence_runs) {
    layers_in_runs += run.layers.size();
    const std::string first = run.layers.front().name;
    if (run.num_tokens == 0) {
      throw OptionError(
          option,
          "true",
          fmt::format(
              "false, or \"{}\" (VitEncoderLayer) right after a models::VitPatchEmbedding in "
              "its Sequential (which says how many tokens the layers split)",
              first));
    }
    if (run.num_tokens < tp_size) {
      throw OptionError(
          option,
          "true",
          fmt::format(
              "false when \"{}\" (VitEncoderLayer) takes {} tokens, fewer than the {} ranks "
              "(each rank holds at least one)",
              first,
              run.num_tokens,
              tp_size));
    }
  }
  if (layers_in_runs != targets.vit_layers.size()) {
    throw OptionError(
        option,
        "true",
        "false, or every models::VitEncoderLayer a child of a torch::nn::Sequential (a run of "
        "them splits the tokens once, before the first)");
  }
}

void require_divisible(
    const std::string& module,
    const std::string& size_name,
    int64_t size,
    int64_t tp_size,
    const std::string& why) {
  if (size % tp_size != 0) {
    throw OptionError(
        fmt::format("{} {}", module, size_name),
        std::to_string(size),
        fmt::format("a multiple of the tensor-parallel size {} ({})", tp_size, why));
  }
}

void check_vit_layer(const VitLayerTarget& target, int64_t tp_size) {
  const std::string module = fmt::format("\"{}\" (VitEncoderLayer)", target.name);
  const models::VitEncoderLayerOptions& options = target.layer->options();
  require_divisible(
      module, "num_heads", options.num_heads, tp_size, "each rank computes whole heads");
  require_divisible(
      module, "hidden_dim", options.hidden_dim, tp_size, "qkv and proj are split by features");
  require_divisible(
      module, "mlp_dim", options.mlp_dim, tp_size, "fc1's outputs are split over the ranks");
  for (const char* linear : {"qkv", "proj", "fc1", "fc2"}) {
    if (linear_child(*target.layer, linear) == nullptr) {
      throw OptionError(
          fmt::format("{} child {}", module, linear),
          "not a torch::nn::Linear",
          "the layer's own Linear (is the model tensor-parallel already?)");
    }
  }
}

// The type names of `model`'s modules, for an error saying that none has a plan.
std::string module_types(torch::nn::Module& model) {
  std::set<std::string> types;
  for (const auto& [name, module] : all_modules(model)) {
    types.insert(module->name());
  }
  return fmt::format("{}", fmt::join(types, ", "));
}

// qkv's output is [q of all heads | k | v]: three blocks, each split by heads, so that each
// rank holds whole heads.
constexpr int64_t kQkvOutputBlocks = 3;

enum class LinearSplit { kColumn, kRow };

// One Linear the plans split, and how: the one list apply_tensor_parallel builds its layers
// from and planned_tensor_parallel_shards sizes.
struct PlannedLinear {
  std::string name; // the Linear's full module name ("trunk.1.qkv")
  torch::nn::LinearImpl* linear;
  LinearSplit split;
  int64_t num_output_blocks = 1; // a column split's (ColumnParallelLinearOptions)
  // Sequence parallelism: the tokens a column layer gathers, or (> 0) a row layer scatters.
  int64_t sequence_length = 0;
};

// The tokens of `layer` under sequence parallelism (its run's), or 0 without it.
int64_t sequence_length_of(
    const TensorParallelTargets& targets,
    const models::VitEncoderLayerImpl* layer,
    bool sequence_parallel) {
  if (!sequence_parallel) {
    return 0;
  }
  for (const SequenceRun& run : targets.sequence_runs) {
    for (const VitLayerTarget& target : run.layers) {
      if (target.layer == layer) {
        return run.num_tokens;
      }
    }
  }
  return 0; // check_sequence_parallel_plan has refused such a layer
}

// ViT layers: qkv and fc1 column-, proj and fc2 row-parallel; MLP pairs: column then row.
std::vector<PlannedLinear>
planned_linears(const TensorParallelTargets& targets, bool sequence_parallel = false) {
  std::vector<PlannedLinear> planned;
  for (const VitLayerTarget& target : targets.vit_layers) {
    const int64_t tokens = sequence_length_of(targets, target.layer, sequence_parallel);
    const auto plan = [&](const char* child, LinearSplit split, int64_t blocks = 1) {
      planned.push_back(
          {child_name(target.name, child),
           linear_child(*target.layer, child),
           split,
           blocks,
           tokens});
    };
    plan("qkv", LinearSplit::kColumn, kQkvOutputBlocks);
    plan("proj", LinearSplit::kRow);
    plan("fc1", LinearSplit::kColumn);
    plan("fc2", LinearSplit::kRow);
  }
  for (const MlpPairTarget& pair : targets.mlp_pairs) {
    planned.push_back(
        {child_name(pair.column_name, "linear"),
         linear_child(*pair.column, "linear"),
         LinearSplit::kColumn});
    planned.push_back(
        {child_name(pair.row_name, "linear"),
         linear_child(*pair.row, "linear"),
         LinearSplit::kRow});
  }
  return planned;
}

// This rank's layer for `planned` (tensor_parallel.h).
torch::nn::AnyModule
shard_linear(const PlannedLinear& planned, const std::shared_ptr<comm::ProcessGroup>& tp_group) {
  if (planned.split == LinearSplit::kRow) {
    RowParallelLinearOptions options;
    options.scatter_sequence = planned.sequence_length > 0;
    return torch::nn::AnyModule(RowParallelLinear(*planned.linear, tp_group, options));
  }
  ColumnParallelLinearOptions options;
  options.num_output_blocks = planned.num_output_blocks;
  options.sequence_length = planned.sequence_length;
  return torch::nn::AnyModule(ColumnParallelLinear(*planned.linear, tp_group, options));
}

// The gather after a run restores the token count of the size the ViT was built for; an
// input of another size (its positional embedding interpolated, models::VitPatchEmbedding)
// would be cut or padded to it. Every rank holds the same input, so all refuse it alike,
// before any collective.
void require_planned_tokens(const at::Tensor& x, int64_t tokens) {
  if (x.size(1) != tokens) {
    throw OptionError(
        "TensorParallelPlanOptions::sequence_parallel",
        "true",
        fmt::format(
            "false for inputs of another size than the vision_transformer was built for: "
            "{} tokens, not its {} (tensor parallelism without sequence parallelism takes them)",
            x.size(1),
            tokens));
  }
}

// Every run's layers' hooks: each sums its norms' gradients over the ranks, the first splits
// the tokens and the last gathers them (its gradient then is the same on every rank: what
// follows is replicated).
using SequenceHooksByLayer = std::
    map<const models::VitEncoderLayerImpl*, models::VitEncoderLayerImpl::SequenceParallelHooks>;

SequenceHooksByLayer sequence_parallel_hooks(
    const TensorParallelTargets& targets, const std::shared_ptr<comm::ProcessGroup>& tp_group) {
  SequenceHooksByLayer hooks;
  for (const SequenceRun& run : targets.sequence_runs) {
    for (const VitLayerTarget& target : run.layers) {
      auto& layer_hooks = hooks[target.layer];
      layer_hooks.sum_gradient_over_shards = [tp_group](const at::Tensor& parameter) {
        return copy_to_tensor_parallel_region(parameter, *tp_group);
      };
    }
    hooks[run.layers.front().layer].scatter_input = [tp_group,
                                                     tokens = run.num_tokens](const at::Tensor& x) {
      require_planned_tokens(x, tokens);
      return scatter_to_sequence_parallel_region(x, *tp_group);
    };
    hooks[run.layers.back().layer].gather_output = [tp_group,
                                                    tokens = run.num_tokens](const at::Tensor& x) {
      return gather_from_sequence_parallel_region(x, *tp_group, tokens);
    };
  }
  return hooks;
}

} // namespace

std::map<std::string, TensorParallelShardSpec>
planned_tensor_parallel_shards(torch::nn::Module& model, int64_t tp_size) {
  check_tensor_parallel_plan(model, tp_size);
  // As ColumnParallelLinear and RowParallelLinear split them: a column layer its weight's and
  // bias's rows, a row layer its weight's columns (its bias is replicated).
  std::map<std::string, TensorParallelShardSpec> shards;
  for (const PlannedLinear& planned : planned_linears(find_targets(model))) {
    if (planned.split == LinearSplit::kRow) {
      shards[planned.name + ".weight"] = {1, 1};
      continue;
    }
    shards[planned.name + ".weight"] = {0, planned.num_output_blocks};
    if (planned.linear->bias.defined()) {
      shards[planned.name + ".bias"] = {0, planned.num_output_blocks};
    }
  }
  return shards;
}

std::vector<ParameterSize> tensor_parallel_parameter_sizes(
    torch::nn::Module& model, std::vector<ParameterSize> sizes, int64_t tp_size) {
  const auto shards = planned_tensor_parallel_shards(model, tp_size);
  size_t found = 0;
  for (ParameterSize& size : sizes) {
    if (shards.count(size.name) != 0) {
      size.numel /= tp_size; // the plan's checks make every split even
      ++found;
    }
  }
  TORCH_CHECK(
      found == shards.size(),
      "tensor_parallel_parameter_sizes: `sizes` name ",
      found,
      " of the ",
      shards.size(),
      " parameters the plan splits; give the sizes of `model` itself (parameter_sizes(model))");
  return sizes;
}

void check_tensor_parallel_plan(
    torch::nn::Module& model, int64_t tp_size, const TensorParallelPlanOptions& options) {
  if (tp_size < 1) {
    throw OptionError("tensor-parallel size", std::to_string(tp_size), "an integer >= 1");
  }
  if (const auto sharded = tensor_parallel_sharded_parameters(model); !sharded.empty()) {
    throw OptionError(
        "apply_tensor_parallel model",
        fmt::format("tensor-parallel already ({} sharded parameters)", sharded.size()),
        "a model not yet sharded");
  }
  const TensorParallelTargets targets = find_targets(model);
  if (targets.vit_layers.empty() && targets.mlp_pairs.empty()) {
    throw OptionError(
        "apply_tensor_parallel model",
        fmt::format("a model of modules {{{}}}", module_types(model)),
        "one with models::VitEncoderLayer layers or an MLP trunk of at least two consecutive "
        "Linear models::MlpBlock blocks: other layers have no tensor-parallel plan");
  }
  for (const VitLayerTarget& target : targets.vit_layers) {
    check_vit_layer(target, tp_size);
  }
  for (const MlpPairTarget& pair : targets.mlp_pairs) {
    require_divisible(
        fmt::format(
            "\"{}\" (MlpBlock, column-parallel before \"{}\")", pair.column_name, pair.row_name),
        "out_features",
        linear_child(*pair.column, "linear")->options.out_features(),
        tp_size,
        "its outputs are split over the ranks");
  }
  if (options.sequence_parallel) {
    check_sequence_parallel_plan(targets, tp_size);
  }
}

std::vector<std::string> apply_tensor_parallel(
    torch::nn::Module& model,
    std::shared_ptr<comm::ProcessGroup> tp_group,
    const TensorParallelPlanOptions& options) {
  const int64_t tp_size = tp_group->world_size();
  check_tensor_parallel_plan(model, tp_size, options);
  const TensorParallelTargets targets = find_targets(model);
  // Every shard is built before any layer changes: the planned Linears are the layers' own.
  std::map<std::string, torch::nn::AnyModule> shards;
  for (const PlannedLinear& planned : planned_linears(targets, options.sequence_parallel)) {
    shards.emplace(planned.name, shard_linear(planned, tp_group));
  }
  SequenceHooksByLayer sequence_hooks;
  if (options.sequence_parallel) {
    sequence_hooks = sequence_parallel_hooks(targets, tp_group);
  }
  std::vector<std::string> sharded;
  for (const VitLayerTarget& target : targets.vit_layers) {
    const auto shard = [&](const char* child) { return shards.at(child_name(target.name, child)); };
    models::VitEncoderLayerImpl::TensorParallelLinears linears;
    linears.qkv = shard("qkv");
    linears.proj = shard("proj");
    linears.fc1 = shard("fc1");
    auto fc1 = linears.fc1.ptr<ColumnParallelLinearImpl>();
    linears.fc1_without_bias = [fc1](const at::Tensor& x) { return fc1->forward_without_bias(x); };
    linears.fc1_bias = [fc1] { return fc1->bias; };
    linears.fc2 = shard("fc2");
    linears.local_heads = target.layer->options().num_heads / tp_size;
    linears.shard_index = tp_group->rank();
    linears.sequence = std::move(sequence_hooks[target.layer]); // empty without
    target.layer->use_tensor_parallel_linears(std::move(linears));
    sharded.push_back(target.name);
  }
  for (const MlpPairTarget& pair : targets.mlp_pairs) {
    pair.column->use_tensor_parallel_linear(shards.at(child_name(pair.column_name, "linear")));
    pair.row->use_tensor_parallel_linear(shards.at(child_name(pair.row_name, "linear")));
    sharded.push_back(pair.column_name);
    sharded.push_back(pair.row_name);
  }
  return sharded;
}

double tensor_parallel_grad_norm(const torch::nn::Module& model, comm::ProcessGroup& tp_group) {
  const auto specs = tensor_parallel_sharded_parameters(model);
  const auto parameters = model.named_parameters();
  // Summed in float64 on the parameters' device (the group's collectives take it there).
  const auto options =
      at::TensorOptions()
          .dtype(at::kDouble)
          .device(parameters.is_empty() ? at::Device(at::kCPU) : parameters[0].value().device());
  at::Tensor sharded_squares = at::zeros({1}, options);
  at::Tensor replicated_squares = at::zeros({1}, options);
  for (const auto& item : parameters) {
    const at::Tensor& grad = item.value().grad();
    if (!grad.defined()) {
      continue;
    }
    at::Tensor squares = grad.detach().to(at::kDouble).square().sum().reshape({1});
    (specs.count(item.key()) != 0 ? sharded_squares : replicated_squares).add_(squares);
  }
  // Every rank holds a different part of the shards and the same replicated gradients.
  tp_group.all_reduce(sharded_squares);
  return std::sqrt(sharded_squares.item<double>() + replicated_squares.item<double>());
}

double clip_tensor_parallel_grad_norm_(
    torch::nn::Module& model, double max_norm, comm::ProcessGroup& tp_group) {
  const double norm = tensor_parallel_grad_norm(model, tp_group);
  const double coefficient = max_norm / (norm + 1e-6); // torch.nn.utils.clip_grad_norm_'s
  if (coefficient < 1.0) {
    torch::NoGradGuard no_grad;
    for (at::Tensor& parameter : model.parameters()) {
      if (parameter.grad().defined()) {
        parameter.grad().mul_(coefficient);
      }
    }
  }
  return norm;
}

} // namespace largo::parallel
