#include <largo/parallel/activation_checkpointing/checkpointed_trunk.h>

#include <largo/core/error.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::parallel {

std::optional<std::vector<int64_t>>
measure_trunk_block_activation_bytes(models::TrunkHeadModel& model, const at::Tensor& probe_input) {
  torch::nn::Sequential trunk = model->trunk();
  return measure_sequential_activation_bytes(torch::nn::AnyModule(model), *trunk, probe_input);
}

CheckpointedTrunk::CheckpointedTrunk(
    models::TrunkHeadModel model, std::vector<int64_t> boundaries, bool preserve_rng_state)
    : model_(std::move(model)),
      boundaries_(std::move(boundaries)),
      preserve_rng_state_(preserve_rng_state) {
  const int64_t num_blocks = model_->num_trunk_blocks();
  check_segmentation(
      boundaries_, num_blocks, fmt::format("the model's {} trunk blocks", num_blocks));
}

CheckpointedTrunk CheckpointedTrunk::plan(
    models::TrunkHeadModel model,
    const TrunkCheckpointingOptions& options,
    const std::vector<int64_t>& sample_shape) {
  torch::nn::Sequential blocks = model->trunk();
  SequentialCheckpointPlan plan = plan_sequential_checkpointing(
      torch::nn::AnyModule(model), *blocks, "the trunk", options.num_splits(),
      options.cost(), sample_shape, options.probe_batch_size());
  CheckpointedTrunk trunk(std::move(model), std::move(plan.boundaries),
                          options.preserve_rng_state());
  trunk.block_activation_bytes_ = std::move(plan.element_bytes);
  trunk.cut_by_ = std::move(plan.cut_by);
  return trunk;
}

at::Tensor CheckpointedTrunk::forward(at::Tensor images) {
  at::Tensor x = std::move(images);
  for (size_t s = 0; s + 2 < boundaries_.size(); ++s) {
    const int64_t begin = boundaries_[s];
    const int64_t end = boundaries_[s + 1];
    std::vector<std::shared_ptr<torch::nn::Module>> blocks;
    for (int64_t block = begin; block < end; ++block) {
      blocks.push_back(model_->trunk_block(block));
    }
    // The segment holds the model so the recompute can run it whenever the backward comes.
    std::shared_ptr<models::TrunkHeadModelImpl> model = model_.ptr();
    x = checkpoint_modules(
            blocks,
            [model, begin, end](const std::vector<at::Tensor>& inputs) {
              return std::vector<at::Tensor>{model->forward_trunk_range(inputs[0], begin, end)};
            },
            {std::move(x)}, preserve_rng_state_)
            .front();
  }
  x = model_->forward_trunk_range(std::move(x), boundaries_[boundaries_.size() - 2],
                                  model_->num_trunk_blocks());
  return model_->forward_head(std::move(x));
}

std::unique_ptr<CheckpointedSegments> CheckpointedTrunk::install() const {
  return CheckpointedSegments::split_sequential(model_->trunk(), "trunk", boundaries_,
                                                preserve_rng_state_);
}

std::string CheckpointedTrunk::describe() const {
  SequentialCheckpointPlan plan{boundaries_, block_activation_bytes_, cut_by_};
  return plan.describe("trunk blocks");
}

std::optional<ActivationMemoryReport> measure_activation_memory(
    CheckpointedTrunk& trunk, const std::vector<int64_t>& sample_shape, int64_t batch_size) {
  models::TrunkHeadModel& model = trunk.model();
  return measure_activation_memory(torch::nn::AnyModule(model), model->trunk(),
                                   trunk.boundaries(), sample_shape, batch_size);
}

} // namespace largo::parallel
