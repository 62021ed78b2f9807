#include <largo/parallel/estimate/memory_estimate.h>

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/parallel/data_parallel/flat_layout.h>
#include <largo/parallel/data_parallel/fully_sharded_data_parallel.h>
#include <largo/parallel/data_parallel/host_offload_optimizer.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <unordered_set>
#include <utility>

namespace largo::parallel {
namespace {

// Adam's, AdamW's, RMSprop's and LAMB's "step" is a 0-d float32 tensor per parameter (per
// piece when sharded).
constexpr int64_t kStepScalarBytes = 4;

int64_t element_bytes(at::ScalarType dtype) {
  return static_cast<int64_t>(c10::elementSize(dtype));
}

bool has_step_scalar(const optim::OptimizerSpec& optimizer) {
  return optim::state_layout(optimizer).step_scalar;
}

// The trained parameters grouped by dtype, in order of first appearance: ShardedOptimizer's
// flat buffers (one per dtype on one device).
std::vector<std::pair<at::ScalarType, std::vector<int64_t>>> trained_numels_by_dtype(
    const std::vector<ParameterSize>& parameters) {
  std::vector<std::pair<at::ScalarType, std::vector<int64_t>>> buffers;
  for (const ParameterSize& param : parameters) {
    if (!param.trained) {
      continue;
    }
    auto it = std::find_if(buffers.begin(), buffers.end(),
                           [&](const auto& buffer) { return buffer.first == param.dtype; });
    if (it == buffers.end()) {
      buffers.emplace_back(param.dtype, std::vector<int64_t>{});
      it = std::prev(buffers.end());
    }
    it->second.push_back(param.numel);
  }
  return buffers;
}

int64_t frozen_bytes(const std::vector<ParameterSize>& parameters) {
  int64_t bytes = 0;
  for (const ParameterSize& param : parameters) {
    if (!param.trained) {
      bytes += param.numel * element_bytes(param.dtype);
    }
  }
  return bytes;
}

at::ScalarType state_dtype(at::ScalarType param_dtype, const MemoryEstimateOptions& options) {
  return options.master_weights_dtype.value_or(param_dtype);
}

int64_t state_bytes_per_element(at::ScalarType param_dtype, const MemoryEstimateOptions& options) {
  return optimizer_state_bytes_per_element(options.optimizer, state_dtype(param_dtype, options),
                                           options.master_weights_dtype.has_value());
}

} // namespace

std::vector<ParameterSize> parameter_sizes(const torch::nn::Module& module) {
  std::vector<ParameterSize> sizes;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& param = item.value();
    sizes.push_back({item.key(), param.numel(), param.scalar_type(), param.requires_grad()});
  }
  return sizes;
}

std::vector<ParameterSize> parameter_sizes(const torch::nn::Module& module,
                                           const std::vector<optim::ParamGroup>& groups) {
  std::vector<ParameterSize> sizes;
  std::unordered_set<const void*> in_groups;
  for (const optim::ParamGroup& group : groups) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      const at::Tensor& param = group.params[i];
      in_groups.insert(param.unsafeGetTensorImpl());
      std::string name = i < group.names.size() ? group.names[i] : fmt::format("{}.{}", group.name, i);
      sizes.push_back({std::move(name), param.numel(), param.scalar_type(), true});
    }
  }
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& param = item.value();
    if (in_groups.count(param.unsafeGetTensorImpl()) == 0) {
      sizes.push_back({item.key(), param.numel(), param.scalar_type(), false});
    }
  }
  return sizes;
}

void MemoryEstimateOptions::validate() const {
  if (world_size < 1) {
    throw OptionError(
        "MemoryEstimateOptions::world_size", std::to_string(world_size), "an integer >= 1");
  }
  if (stage < 0 || stage > 3) {
    throw OptionError("MemoryEstimateOptions::stage", std::to_string(stage), "0 (DDP), 1, 2 or 3");
  }
  if (rank < 0 || rank >= world_size) {
    throw OptionError(
        "MemoryEstimateOptions::rank",
        std::to_string(rank),
        fmt::format("a rank in [0, {}) (the world size)", world_size));
  }
  if (offload_optimizer && stage == 0) {
    throw OptionError(
        "MemoryEstimateOptions::offload_optimizer",
        "true",
        "false at stage 0 (DDP): offload moves a sharded optimizer");
  }
  const auto& names = optim::optimizer_names();
  if (std::find(names.begin(), names.end(), optimizer.name) == names.end()) {
    throw OptionError(
        "OptimizerSpec::name",
        optimizer.name,
        fmt::format("one of {} (for ZeRO, the base optimizer's name)", fmt::join(names, ", ")));
  }
}

int64_t optimizer_state_bytes_per_element(const optim::OptimizerSpec& optimizer,
                                          at::ScalarType state_dtype, bool with_master_weights) {
  // State tensors shaped like the parameter; LARC keeps none of its own.
  int64_t tensors = optim::state_layout(optimizer).tensors_per_parameter;
  if (with_master_weights) {
    tensors += 1;
  }
  return tensors * element_bytes(state_dtype);
}

ModelStateBytes estimate_model_state_bytes(const std::vector<ParameterSize>& parameters,
                                           const MemoryEstimateOptions& options) {
  options.validate();
  const bool step_scalar = has_step_scalar(options.optimizer);
  ModelStateBytes bytes;
  bytes.parameters = frozen_bytes(parameters);
  if (options.stage == 0) {
    for (const ParameterSize& param : parameters) {
      if (!param.trained) {
        continue;
      }
      const int64_t size = element_bytes(param.dtype);
      bytes.parameters += param.numel * size;
      bytes.gradients += param.numel * size;
      bytes.optimizer_state += param.numel * state_bytes_per_element(param.dtype, options) +
          (step_scalar ? kStepScalarBytes : 0);
    }
    return bytes;
  }
  for (const auto& [dtype, numels] : trained_numels_by_dtype(parameters)) {
    const FlatLayout layout(numels, options.world_size);
    const int64_t size = element_bytes(dtype);
    // The flat buffer: whole on every rank in stages 1 and 2, this rank's slice in stage 3.
    bytes.parameters += (options.stage == 3 ? layout.shard_numel() : layout.padded_numel()) * size;
    // Gradients: full (stage 1 reads its part of DDP's full gradients), else the shard.
    bytes.gradients += (options.stage == 1 ? layout.total_numel() : layout.shard_numel()) * size;
    // Optimizer state: this rank's pieces only (the padding has no state). Offloaded: on the
    // host, with a copy of each piece and of its gradient.
    const int64_t per_element = state_bytes_per_element(dtype, options);
    int64_t& state = options.offload_optimizer ? bytes.host : bytes.optimizer_state;
    for (const ShardPiece& piece : layout.pieces_of_rank(options.rank)) {
      state += piece.numel * per_element + (step_scalar ? kStepScalarBytes : 0);
      if (options.offload_optimizer) {
        bytes.host += 2 * piece.numel * size;
      }
    }
  }
  return bytes;
}

ModelStateBytes zero_formula_bytes(const std::vector<ParameterSize>& parameters,
                                   const MemoryEstimateOptions& options) {
  options.validate();
  // Psi * p, Psi * g and Psi * K summed over the parameters (each with its own dtype).
  double params = 0, grads = 0, state = 0;
  for (const ParameterSize& param : parameters) {
    if (!param.trained) {
      continue;
    }
    const auto numel = static_cast<double>(param.numel);
    params += numel * static_cast<double>(element_bytes(param.dtype));
    grads += numel * static_cast<double>(element_bytes(param.dtype));
    state += numel * static_cast<double>(state_bytes_per_element(param.dtype, options));
  }
  const auto n = static_cast<double>(options.world_size);
  const int stage = options.stage;
  ModelStateBytes bytes;
  bytes.parameters = frozen_bytes(parameters) + std::llround(stage >= 3 ? params / n : params);
  bytes.gradients = std::llround(stage >= 2 ? grads / n : grads);
  bytes.optimizer_state = std::llround(stage >= 1 ? state / n : state);
  return bytes;
}

ModelStateBytes measure_model_state_bytes(const torch::nn::Module& model,
                                          const optim::Optimizer& optimizer) {
  ModelStateBytes bytes;
  // Each storage once: the ZeRO parameters share their flat buffer, DDP's gradients their
  // bucket.
  std::unordered_set<const void*> param_storages;
  std::unordered_set<const void*> grad_storages;
  for (const at::Tensor& param : model.parameters(/*recurse=*/true)) {
    if (param_storages.insert(param.storage().unsafeGetStorageImpl()).second) {
      bytes.parameters += static_cast<int64_t>(param.storage().nbytes());
    }
    const at::Tensor& grad = param.grad();
    if (grad.defined() && grad_storages.insert(grad.storage().unsafeGetStorageImpl()).second) {
      bytes.gradients += static_cast<int64_t>(grad.storage().nbytes());
    }
  }
  if (const auto* sharded = dynamic_cast<const ShardedOptimizer*>(&optimizer)) {
    bytes.gradients += sharded->gradient_shard_bytes();
  }
  if (const HostOffloadOptimizer* offload = find_host_offload(optimizer)) {
    bytes.host = offload->host_bytes();
  } else {
    bytes.optimizer_state = optimizer.state_bytes();
  }
  return bytes;
}

ModelStateBytes measure_model_state_bytes(const FullyShardedDataParallel& fsdp,
                                          const optim::Optimizer& optimizer) {
  // The units' freed full buffers count 0 bytes here; frozen parameters count whole.
  ModelStateBytes bytes = measure_model_state_bytes(*fsdp.module(), optimizer);
  bytes.parameters += fsdp.shard_bytes();
  bytes.gradients += fsdp.shard_bytes(); // the gradient shards have the shards' sizes
  return bytes;
}

} // namespace largo::parallel
