// The model a MoCo run trains (VISSL's moco_loss with its MoCoHook): the query encoder (a
// TrunkHeadModel's trunk and head, registered as "trunk" and "head" as MultiCropModel does, so
// its checkpoint initializes a linear evaluation) and its momentum encoder, a second model of
// the same architecture that is not a child module: the optimizer, data parallelism and the
// model's state dict never see it (the loss's checkpoint state carries it, momentum_state_dict).
//
// forward(packed [n, view 0 | view 1], pack_views) in training mode, as VISSL's on_forward:
//   1. the momentum encoder: on the first training forward its parameters become copies of
//      the query encoder's (VISSL builds it then); on every later one
//      p_k = p_k * momentum + p_q * (1 - momentum) (parameters only; its BatchNorm statistics
//      are its own);
//   2. query = head(trunk(view 0))                                   [n, d], with gradient
//   3. key = normalize(momentum encoder(view 1)), without gradient   [n, d]; with
//      shuffle_batch over several ranks, view 1 is first gathered from every rank, permuted
//      and split (each rank encodes a mix of all ranks' images, so BatchNorm's batch statistics
//      cannot leak which key is the positive), and the keys are gathered and put back in order
//   4. returns [n, 2d]: query | key (SelfSupervisedLoss splits them).
// In eval mode the momentum encoder is neither updated nor shuffled. The momentum encoder is
// whole on every rank. Where data parallelism shards the query encoder's own tensors (FSDP:
// placements().module_holds_whole_model() is false), step 1 reads the whole values the caller
// gathered before the step's forwards (set_whole_query_parameters).
//
// Collectives: with shuffle_batch and a process group of several ranks, forward all-gathers
// twice (view 1's images, then the keys), the same on every rank. Every rank draws the same
// permutation from (shuffle_seed, forward index), so unlike VISSL no broadcast is needed.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/models/module_swap.h>
#include <largo/models/momentum_copy.h>
#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace largo::models {

struct MocoModelOptions {
  double momentum = 0.999;   // the momentum encoder's EMA factor, in [0, 1]
  bool shuffle_batch = true; // the keys' batch shuffled across the ranks (see above)
  uint64_t shuffle_seed = 0; // the permutation of forward i is drawn from shuffle_seed + i
};

class MocoModelImpl : public torch::nn::Module, public SwappableChildren {
 public:
  // `query` is trained; `momentum_encoder` must have the same parameter names and shapes
  // (build_model with the same options: its values are replaced on the first forward).
  // `view_shapes`: [channels, h, w] of the 2 views. Throws OptionError for a momentum outside
  // [0, 1], ConfigError for other than 2 views or encoders that differ.
  MocoModelImpl(
      const TrunkHeadModel& query,
      TrunkHeadModel momentum_encoder,
      std::vector<std::vector<int64_t>> view_shapes,
      MocoModelOptions options = {});

  // The ranks whose batches make the global batch (the shuffle's); none: no shuffle.
  void set_process_group(std::shared_ptr<comm::ProcessGroup> group) {
    group_ = std::move(group);
  }

  // The query encoder's whole values by name, which the next training forwards build or update
  // the momentum encoder from instead of the module's own tensors (they are shards: FSDP); an
  // empty list returns to the module's own. Set them before each step's forwards (the values
  // the optimizer left), clear them after it (they hold a whole copy of the model).
  void set_whole_query_parameters(WholeParameters values) {
    whole_query_ = std::move(values);
  }

  // packed [n, Σ view numels] -> [n, 2d] (query | key).
  at::Tensor forward(const at::Tensor& packed);

  const MocoModelOptions& options() const {
    return options_;
  }
  const TrunkHeadModel& momentum_encoder() const {
    return momentum_;
  }
  // Training forwards so far (the momentum encoder exists once it is > 0).
  int64_t num_forwards() const {
    return forwards_;
  }
  // "moco_encoder.<name>" for each of the momentum encoder's parameters and buffers, and
  // "moco_num_forwards", on the CPU.
  std::map<std::string, at::Tensor> momentum_state_dict() const;
  // Throws CheckpointError for a missing entry or a shape that differs.
  void load_momentum_state_dict(const std::map<std::string, at::Tensor>& state);

  const torch::nn::Sequential& trunk() const {
    return trunk_;
  }
  const torch::nn::Sequential& head() const {
    return head_;
  }
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  std::vector<at::Tensor> unpack(const at::Tensor& packed) const;
  void advance_momentum_encoder();
  at::Tensor keys(const at::Tensor& images); // [n, c, h, w] -> normalised [n, d]
  at::Tensor shuffled_keys(const at::Tensor& images, comm::ProcessGroup& group);

  torch::nn::Sequential trunk_;
  torch::nn::Sequential head_;
  TrunkHeadModel momentum_;
  std::vector<std::vector<int64_t>> view_shapes_;
  MocoModelOptions options_;
  std::shared_ptr<comm::ProcessGroup> group_;
  WholeParameters whole_query_; // empty: the module's own tensors
  int64_t forwards_ = 0;
};

TORCH_MODULE(MocoModel);

} // namespace largo::models
