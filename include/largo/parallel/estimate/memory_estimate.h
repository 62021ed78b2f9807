// Per-rank bytes of model state (parameters, gradients, optimizer state) under ZeRO stages
// 0-3: an estimate from the parameters' sizes and dtypes, the optimizer, the stage and the
// world size, and a measurement of what the library actually holds in the same categories,
// so the two can be compared (`largo estimate`, the trainer's start-up log, the ZeRO
// benchmark; docs/zero_memory.md).
//
// The estimate is the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3: model
// states = parameters + gradients + optimizer states, K bytes of optimizer state per
// parameter element) applied to Largo's real layout rather than to the paper's idealized
// one:
//   - each parameter counts with its own dtype, and optimizer state with the dtype the
//     optimizer keeps it in (the parameter's, or the fp32 master weights' under O2);
//   - state is what Largo's optimizers store (src/largo/optim/*.cpp): SGD one momentum
//     buffer when momentum != 0; AdamW exp_avg and exp_avg_sq (+ max_exp_avg_sq with
//     amsgrad) and a 0-d float32 "step" per parameter; LAMB exp_avg, exp_avg_sq and "step";
//     LARC nothing of its own;
//   - stages 1-3 use ShardedOptimizer's flat even slices (flat_layout.h): one flat buffer per
//     dtype, padded to a multiple of the world size; a rank's optimizer state covers its
//     pieces, with one "step" scalar per piece.
// Stage 0 is DDP (everything full), 1 shards optimizer state (the flat parameter buffer is
// padded), 2 also gradients, 3 also parameters (FSDP: its figure is the
// formula applied to the same slices). Frozen parameters count as full parameters only.
// Transient memory (DDP/SDP communication buckets in flight, stage 3's gathered parameters,
// activations) is not model state and is not counted.
//
// No collectives.
#pragma once

#include <largo/optim/optimizer.h>
#include <largo/optim/optimizer_factory.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace largo::parallel {

class FullyShardedDataParallel;

// One parameter as the estimator sees it.
struct ParameterSize {
  std::string name;
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  bool trained = true; // false: frozen (no gradient, no optimizer state)
};

// The parameters of `module` in registration order; trained = requires_grad.
std::vector<ParameterSize> parameter_sizes(const torch::nn::Module& module);
// The parameters of the optimizer groups over `module`, in group order (the order
// ShardedOptimizer lays them out in) and trained, then `module`'s parameters that are in no
// group, frozen.
std::vector<ParameterSize> parameter_sizes(const torch::nn::Module& module,
                                           const std::vector<optim::ParamGroup>& groups);

struct MemoryEstimateOptions {
  // Which optimizer (name, momentum, amsgrad, LARC): decides the state per element.
  optim::OptimizerSpec optimizer;
  // Mixed precision O2: the optimizer steps fp32 master copies of the (half precision)
  // parameters; the copies and the state are in this dtype. nullopt: no master weights, the
  // state has the parameters' dtype.
  std::optional<at::ScalarType> master_weights_dtype;
  int world_size = 1;
  int stage = 0; // ZeRO stage 0 (DDP) .. 3
  int rank = 0;  // whose bytes; rank 0 holds the most (the padding sits in the last shard)
  // Stages 1-3: the optimizer state and copies of the pieces in host memory (ModelStateBytes::
  // host) rather than on the device.
  bool offload_optimizer = false;

  // Throws ConfigError for a world size < 1, a stage outside 0..3, a rank outside
  // [0, world_size), an optimizer name other than sgd, adamw, lamb, or offload at stage 0.
  void validate() const;
};

struct ModelStateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  // In host memory, with the optimizer offloaded (host_offload_optimizer.h): its state and
  // the copies of this rank's pieces and of their gradients. Not part of total(), which is
  // the device's.
  int64_t host = 0;
  int64_t total() const {
    return parameters + gradients + optimizer_state;
  }
};

// Optimizer-state bytes per trained parameter element for `optimizer`, with the state kept
// in `state_dtype` (the ZeRO paper's K, counting master weights when `with_master_weights`);
// scalar "step" entries are not included.
int64_t optimizer_state_bytes_per_element(const optim::OptimizerSpec& optimizer,
                                          at::ScalarType state_dtype, bool with_master_weights);

// The per-rank bytes of rank `options.rank` under Largo's layout (see the top comment).
ModelStateBytes estimate_model_state_bytes(const std::vector<ParameterSize>& parameters,
                                           const MemoryEstimateOptions& options);

// The ZeRO paper's formula on the same inputs: Psi elements of p bytes each, gradients of p
// bytes, K bytes of optimizer state, divided exactly by N for the sharded categories
// (stage 1: p + g + K/N; 2: p + (g + K)/N; 3: (p + g + K)/N, times Psi), with no padding and
// no scalar entries. Frozen parameters count as full parameters.
ModelStateBytes zero_formula_bytes(const std::vector<ParameterSize>& parameters,
                                   const MemoryEstimateOptions& options);

// What this rank holds now, in the same categories:
//   parameters: the storages of `model`'s parameters, each counted once (under ZeRO the
//     trained ones are views into ShardedOptimizer's padded flat buffers, counted whole);
//   gradients: the storages of the parameters' .grad tensors (DDP's buckets: the .grad are
//     views into them), plus ShardedOptimizer::gradient_shard_bytes() (stage 2);
//   optimizer state: optimizer.state_bytes() (a ShardedOptimizer's is its shard's); with the
//     optimizer offloaded, none, and its host bytes in host.
// Measure after backward and step but before zero_grad(set_to_none), which frees the .grad
// tensors. Master weights are not measured (no optimizer keeps them yet).
ModelStateBytes measure_model_state_bytes(const torch::nn::Module& model,
                                          const optim::Optimizer& optimizer);

// Stage 3: the same for a FullyShardedDataParallel model and the optimizer it made. Between
// steps a unit's full parameters hold no memory, so what is counted is the parameter and
// gradient shards (plus frozen parameters, kept whole) and the optimizer state; the full
// units gathered during a step are transient (peak_gathered_bytes()).
ModelStateBytes measure_model_state_bytes(const FullyShardedDataParallel& fsdp,
                                          const optim::Optimizer& optimizer);

} // namespace largo::parallel
