// A sequential model as an ordered list of blocks, and the pipeline stages cut from it.
//
// A pipeline needs a model that is a chain of blocks, each mapping one tensor to one tensor
// (batch first: dimension 0 of every activation is the batch). Largo's models are that
// already (a trunk of blocks, then a head; models/trunk_head_model.h); any
// torch::nn::Sequential is too. pipeline_blocks() lists the blocks with their path in the full
// model ("trunk.3", "head.0"), and a PipelineStage holds a contiguous run of them registered
// under those same paths, so a stage's parameters and buffers keep the full model's names
// ("trunk.3.linear.weight"): a stage's state dict is a piece of the full model's, the pieces'
// union is the full one, and checkpoints move between pipeline sizes and non-pipelined runs.
//
// Where to cut (S * V stages over the blocks): boundaries given by the user, or balanced so
// that the costliest stage is as cheap as possible, the cost of a block being its parameter
// count (a proxy for its memory and, for dense layers, its time), its measured forward +
// backward time, or 1 (equal numbers of blocks).
//
// No collectives.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace largo::models {
class TrunkHeadModelImpl;
}

namespace largo::parallel {

struct PipelineBlock {
  std::string name; // the block's path in the full model: "trunk.3", "head.0", "2"
  torch::nn::AnyModule module;
};

// The trunk's blocks ("trunk.<i>"), then the head's elements ("head.<j>").
std::vector<PipelineBlock> pipeline_blocks(models::TrunkHeadModelImpl& model);
// The elements of `sequential`, named "<prefix>.<i>" ("<i>" when prefix is empty).
std::vector<PipelineBlock>
pipeline_blocks(const torch::nn::Sequential& sequential, const std::string& prefix = "");

enum class StageBalance { kParameters, kTime, kBlocks };
// "parameters", "time", "blocks" (MODEL.PIPELINE.BALANCE).
std::string to_string(StageBalance balance);
StageBalance parse_stage_balance(const std::string& name); // ConfigError when unknown

// Parameters of each block (its cost for StageBalance::kParameters).
std::vector<double> block_parameter_counts(const std::vector<PipelineBlock>& blocks);

// Seconds of one forward and backward of each block, run in sequence on `sample` (a
// micro-batch of model inputs), the median of `repeats` runs after one warm-up run. Leaves
// the blocks as they were: the parameters' .grad and the buffers (BatchNorm's running
// statistics) are saved and restored.
std::vector<double> measure_block_seconds(
    const std::vector<PipelineBlock>& blocks, const at::Tensor& sample, int repeats = 3);

// Cuts blocks with `costs` into `num_stages` contiguous non-empty stages minimising the
// largest stage cost; returns {0, b_1, ..., num_blocks}: stage i is blocks [b_i, b_{i+1}).
// Throws ConfigError when there are fewer blocks than stages.
std::vector<int64_t> balanced_stage_boundaries(const std::vector<double>& costs, int num_stages);

// Where a model of `blocks` is cut into `num_stages` stages: at `boundaries` when given
// (checked), else balanced by `balance`; `block_seconds` is called for StageBalance::kTime
// only (measure_block_seconds on a sample, or times every rank agrees on).
std::vector<int64_t> cut_into_stages(
    const std::vector<PipelineBlock>& blocks,
    int num_stages,
    const std::vector<int64_t>& boundaries,
    StageBalance balance,
    const std::function<std::vector<double>()>& block_seconds);

// Throws ConfigError (naming MODEL.PIPELINE.BOUNDARIES) unless `boundaries` has
// num_stages + 1 strictly increasing entries from 0 to num_blocks.
void check_stage_boundaries(
    const std::vector<int64_t>& boundaries, int64_t num_blocks, int num_stages);

// One stage: blocks run in order. Its children are the blocks' paths ("trunk" -> "3"), so
// parameters and buffers are named as in the full model.
class PipelineStageImpl : public torch::nn::Module {
 public:
  explicit PipelineStageImpl(std::vector<PipelineBlock> blocks);
  // [batch, ...] -> [batch, ...]
  at::Tensor forward(at::Tensor x);
  const std::vector<std::string>& block_names() const {
    return names_;
  }

 private:
  std::vector<torch::nn::AnyModule> blocks_;
  std::vector<std::string> names_;
};
TORCH_MODULE(PipelineStage);

} // namespace largo::parallel
