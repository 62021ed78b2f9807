// parallel::estimate_memory (mesh_memory_estimate.h) and the tensor-parallel sizing it uses
// (tensor_parallel_plan.h's planned_tensor_parallel_shards, tensor_parallel_parameter_sizes):
// the shards it sizes are the ones apply_tensor_parallel makes (checked on two ranks), the
// ranks' shards add up to the unsplit model with the replicated parameters counted on every
// rank, ZeRO shards each tensor-parallel rank's parameters over the "dp" replicas, a
// pipeline's ranks cover the model once, and with tensor parallelism inside the stages each
// pipeline rank holds its stages' shards, cut where PipelineParallel cuts the split model
// (checked on four ranks). The ZeRO accounting itself is checked against
// measurements in memory_estimate_test.cpp.
#include <largo/core/aliased_cpu_allocation.h>
#include <largo/core/error.h>
#include <largo/models/mlp.h>
#include <largo/models/trunk_head_model.h>
#include <largo/models/vit.h>
#include <largo/parallel/estimate/mesh_memory_estimate.h>
#include <largo/parallel/parallelize.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>
#include <largo/parallel/pipeline/pipeline_stages.h>
#include <largo/parallel/tensor_parallel/tensor_parallel.h>
#include <largo/parallel/tensor_parallel/tensor_parallel_plan.h>

#include "comm/distributed_test_util.h"
#include "parallel/parallelize_test_util.h"
#include "parallel/tensor_parallel_test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace largo::parallel::mesh_memory_estimate_test {
namespace {

using largo::testing::run_on_ranks;
using testing::borrow;
using testing::with_linear_head;

constexpr int64_t kClasses = 5;

models::TrunkHeadModel make_vit() {
  torch::manual_seed(12);
  return with_linear_head(models::build_vit_trunk(testing::small_vit_options(), 3, 16), kClasses);
}

// Three Linear blocks: a column/row pair and an odd one, replicated like the head.
models::TrunkHeadModel make_mlp() {
  torch::manual_seed(11);
  models::MlpOptions options;
  options.hidden_dims = {32, 24, 16};
  return with_linear_head(models::build_mlp_trunk(options, /*in_channels=*/1, 4), kClasses);
}

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The ViT parameters tensor_parallel_plan.h's top comment says are split (qkv and fc1 whole,
// proj and fc2 their weights), read from the names rather than from the plan's code.
bool vit_parameter_is_split(const std::string& name) {
  for (const char* split :
       {".qkv.weight", ".qkv.bias", ".fc1.weight", ".fc1.bias", ".proj.weight", ".fc2.weight"}) {
    if (ends_with(name, split)) {
      return true;
    }
  }
  return false;
}

int64_t total_numel(const std::vector<ParameterSize>& sizes) {
  int64_t numel = 0;
  for (const auto& size : sizes) {
    numel += size.numel;
  }
  return numel;
}

// The plan's sizes without a group are what apply_tensor_parallel leaves on each rank, and
// the shards it plans are the sharded model's.
void expect_sizes_like_the_sharded_model(
    models::TrunkHeadModel (*make)(), comm::ProcessGroup& group) {
  models::TrunkHeadModel unsharded = make();
  const auto planned = planned_tensor_parallel_shards(*unsharded, group.world_size());
  const auto sized =
      tensor_parallel_parameter_sizes(*unsharded, parameter_sizes(*unsharded), group.world_size());
  models::TrunkHeadModel sharded = make();
  apply_tensor_parallel(*sharded, borrow(group));
  const auto actual = parameter_sizes(*sharded);
  ASSERT_EQ(sized.size(), actual.size());
  for (size_t i = 0; i < sized.size(); ++i) {
    EXPECT_EQ(sized[i].name, actual[i].name);
    EXPECT_EQ(sized[i].numel, actual[i].numel) << actual[i].name;
  }
  const auto specs = tensor_parallel_sharded_parameters(*sharded);
  ASSERT_EQ(planned.size(), specs.size());
  for (const auto& [name, spec] : specs) {
    ASSERT_EQ(planned.count(name), 1u) << name;
    EXPECT_EQ(planned.at(name).dim, spec.dim) << name;
    EXPECT_EQ(planned.at(name).num_blocks, spec.num_blocks) << name;
  }
}

TEST(MeshMemoryEstimateTest, TensorParallelSizesAreTheShardsApplyTensorParallelMakes) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    expect_sizes_like_the_sharded_model(make_vit, group);
    expect_sizes_like_the_sharded_model(make_mlp, group);
  });
}

RunMemoryEstimateOptions sgd_momentum_options(int tp_size) {
  RunMemoryEstimateOptions options;
  options.optimizer.name = "sgd";
  options.optimizer.sgd.momentum = 0.9; // one float32 buffer per element, no scalar entries
  options.parallel.tensor_parallel_size = tp_size;
  return options;
}

// Summed over the T ranks of "tp", every category is the unsplit model's plus the replicated
// parameters' bytes counted T - 1 more times (SGD's momentum has no per-tensor scalars).
TEST(MeshMemoryEstimateTest, TensorParallelRanksAddUpToTheUnsplitModelPlusReplicas) {
  for (const int tp : {2, 4}) {
    const auto whole =
        estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(1, 1, 1), sgd_momentum_options(1));
    const auto split =
        estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(1, 1, tp), sgd_momentum_options(tp));
    int64_t replicated_numel = 0, split_numel = 0;
    for (const auto& size : whole.rank_parameters) {
      (vit_parameter_is_split(size.name) ? split_numel : replicated_numel) += size.numel;
    }
    ASSERT_GT(split_numel, replicated_numel) << "a ViT's Linear layers dominate";
    EXPECT_EQ(split.trained_numel, whole.trained_numel) << "the whole model, unsplit";
    EXPECT_EQ(split.rank_parameter_numel, replicated_numel + split_numel / tp);
    EXPECT_EQ(
        tp * split.rank_parameter_numel, whole.rank_parameter_numel + (tp - 1) * replicated_numel);

    const ModelStateBytes& per_rank = split.zero_stages[0].estimated;
    const ModelStateBytes& unsplit = whole.zero_stages[0].estimated;
    const int64_t replicated_bytes = replicated_numel * 4; // float32
    EXPECT_EQ(tp * per_rank.parameters, unsplit.parameters + (tp - 1) * replicated_bytes);
    EXPECT_EQ(tp * per_rank.gradients, unsplit.gradients + (tp - 1) * replicated_bytes);
    EXPECT_EQ(tp * per_rank.optimizer_state, unsplit.optimizer_state + (tp - 1) * replicated_bytes);
    EXPECT_FALSE(split.fsdp_gathers) << "FSDP does not compose with tensor parallelism";
  }
}

// tp 2 x dp 2: ZeRO shards each tensor-parallel rank's parameters over its 2 replicas. SGD
// momentum, all float32 and trained: one flat buffer padded to even, rank 0 holding
// ceil(N / 2) elements of each sharded category (memory_estimate.h).
TEST(MeshMemoryEstimateTest, ZeroShardsEachTensorParallelRanksParametersOverTheReplicas) {
  RunMemoryEstimateOptions options = sgd_momentum_options(2);
  options.parallel.data_parallelism = DataParallelism::kFsdp;
  const auto estimate = estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(1, 2, 2), options);
  EXPECT_EQ(estimate.data_parallel_size, 2);
  EXPECT_EQ(estimate.state_options.stage, 3) << "the run's stage";
  const int64_t n = estimate.rank_parameter_numel;
  const int64_t half = (n + 1) / 2;
  const ModelStateBytes& ddp = estimate.zero_stages[0].estimated;
  EXPECT_EQ(ddp.total(), 3 * 4 * n);
  const ModelStateBytes& zero1 = estimate.zero_stages[1].estimated;
  EXPECT_EQ(zero1.optimizer_state, 4 * half);
  const ModelStateBytes& zero3 = estimate.zero_stages[3].estimated;
  EXPECT_EQ(zero3.parameters, 4 * half);
  EXPECT_EQ(zero3.gradients, 4 * half);
  EXPECT_EQ(zero3.optimizer_state, 4 * half);
}

// Without tensor parallelism the estimate is the ZeRO accounting of the whole model over the
// world, and FSDP's units are planned.
TEST(MeshMemoryEstimateTest, DataParallelIsTheWholeModelOverTheReplicas) {
  RunMemoryEstimateOptions options = sgd_momentum_options(1);
  models::TrunkHeadModel model = make_mlp();
  const auto expected_sizes = parameter_sizes(*model);
  const auto estimate = estimate_memory(model.ptr(), pp_dp_tp_dimensions(1, 4, 1), options);
  EXPECT_EQ(estimate.rank_parameter_numel, total_numel(expected_sizes));
  EXPECT_EQ(estimate.trained_numel, total_numel(expected_sizes));
  EXPECT_EQ(estimate.zero_stages[0].estimated.total(), 3 * 4 * total_numel(expected_sizes));
  const int64_t quarter = (total_numel(expected_sizes) + 3) / 4;
  EXPECT_EQ(estimate.zero_stages[2].estimated.gradients, 4 * quarter);
  EXPECT_TRUE(estimate.fsdp_gathers) << "stage 3's units are planned without tensor parallelism";
  EXPECT_FALSE(estimate.pipeline);
}

// `largo estimate` builds the model in aliased scratch memory (core/aliased_cpu_allocation.h):
// the estimate reads shapes only, so it is the estimate of the model built whole, O2's cast
// and FSDP's units included, and the build took the memory of its largest tensor.
TEST(MeshMemoryEstimateTest, AModelBuiltInAliasedMemoryIsEstimatedAsOneBuiltWhole) {
  RunMemoryEstimateOptions options = sgd_momentum_options(1);
  options.parallel.precision.cast_model = true; // Apex O2: bfloat16 parameters, float32 masters
  options.parallel.precision.low_precision = at::kBFloat16;
  options.parallel.precision.master_weights = true;
  const auto mesh = pp_dp_tp_dimensions(1, 4, 1);
  const MeshMemoryEstimate whole = estimate_memory(make_vit().ptr(), mesh, options);
  MeshMemoryEstimate aliased;
  int64_t scratch_bytes = 0;
  int64_t largest_bytes = 0;
  int64_t model_bytes = 0;
  {
    const AliasedCpuAllocation shapes_only;
    models::TrunkHeadModel model = make_vit();
    for (const auto& tensor : model->parameters()) {
      largest_bytes = std::max<int64_t>(largest_bytes, tensor.nbytes());
      model_bytes += tensor.nbytes();
    }
    aliased = estimate_memory(model.ptr(), mesh, options);
    scratch_bytes = shapes_only.scratch_bytes();
  }
  EXPECT_EQ(aliased.parameter_dtype, at::kBFloat16);
  EXPECT_EQ(aliased.trained_numel, whole.trained_numel);
  EXPECT_EQ(aliased.frozen_numel, whole.frozen_numel);
  ASSERT_EQ(aliased.rank_parameters.size(), whole.rank_parameters.size());
  for (size_t i = 0; i < whole.rank_parameters.size(); ++i) {
    EXPECT_EQ(aliased.rank_parameters[i].name, whole.rank_parameters[i].name);
    EXPECT_EQ(aliased.rank_parameters[i].numel, whole.rank_parameters[i].numel);
  }
  for (size_t stage = 0; stage < whole.zero_stages.size(); ++stage) {
    EXPECT_EQ(
        aliased.zero_stages[stage].estimated.total(), whole.zero_stages[stage].estimated.total())
        << "stage " << stage;
    EXPECT_EQ(aliased.zero_stages[stage].formula.total(), whole.zero_stages[stage].formula.total())
        << "stage " << stage;
  }
  ASSERT_TRUE(aliased.fsdp_gathers && whole.fsdp_gathers);
  EXPECT_EQ(aliased.fsdp_gathers->kept_bytes, whole.fsdp_gathers->kept_bytes);
  EXPECT_EQ(aliased.fsdp_gathers->num_block_units, whole.fsdp_gathers->num_block_units);
  EXPECT_EQ(
      aliased.fsdp_gathers->largest_block_unit_bytes, whole.fsdp_gathers->largest_block_unit_bytes);
  const int64_t page = static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(scratch_bytes, (largest_bytes + page - 1) / page * page)
      << "the model's " << model_bytes << " bytes built in its largest tensor's";
}

// pp 2 x dp 1: every pipeline rank holds its stages' parameters, covering the model once.
TEST(MeshMemoryEstimateTest, APipelinesRanksCoverTheModelOnce) {
  RunMemoryEstimateOptions options = sgd_momentum_options(1);
  options.parallel.pipeline.size = 2;
  options.parallel.pipeline.stages.num_microbatches(2);
  options.sample_shape = {1, 4, 4};
  options.batch_per_replica = 4;
  models::TrunkHeadModel model = make_mlp();
  const int64_t numel = total_numel(parameter_sizes(*model));
  const auto estimate = estimate_memory(model.ptr(), pp_dp_tp_dimensions(2, 1, 1), options);
  ASSERT_TRUE(estimate.pipeline);
  ASSERT_EQ(estimate.pipeline->ranks.size(), 2u);
  int64_t covered = 0;
  for (const auto& rank : estimate.pipeline->ranks) {
    EXPECT_GT(rank.parameter_count, 0) << "rank " << rank.rank << " holds a stage";
    EXPECT_EQ(rank.state.total(), 3 * 4 * rank.parameter_count);
    covered += rank.parameter_count;
  }
  EXPECT_EQ(covered, numel);
  EXPECT_EQ(estimate.pipeline->microbatch_rows, 2);
}

TEST(MeshMemoryEstimateTest, RefusesAMeshThatIsNotTheOptions) {
  try {
    estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(1, 1, 2), sgd_momentum_options(1));
    FAIL() << "a tp 2 mesh for tensor_parallel_size 1 was sized";
  } catch (const OptionError& error) {
    EXPECT_NE(std::string(error.what()).find("\"tp\" dimension"), std::string::npos)
        << error.what();
  }
}

// pp 2 x tp 2 on the small ViT, SGD with momentum (float32, all trained: 3 x 4 bytes per
// element), two micro-batches.
RunMemoryEstimateOptions pipeline_options(int tp_size) {
  RunMemoryEstimateOptions options = sgd_momentum_options(tp_size);
  options.parallel.pipeline.size = 2;
  options.parallel.pipeline.stages.num_microbatches(2);
  options.sample_shape = {3, 16, 16};
  options.batch_per_replica = 4;
  return options;
}

// The elements of one ViT encoder layer that tensor parallelism splits, from its shapes
// (tensor_parallel_plan.h): qkv (weight [3d, d], bias [3d]) and fc1 ([m, d], [m]) whole,
// proj's weight [d, d] and fc2's [d, m] (their biases stay replicated).
int64_t split_numel_per_encoder_layer(const models::VitOptions& vit) {
  const int64_t d = vit.hidden_dim;
  const int64_t m = vit.mlp_dim;
  return (3 * d * d + 3 * d) + (m * d + m) + d * d + d * m;
}

// Cut alike (one encoder layer per stage, by boundaries), each pipeline rank of tp 2 holds
// its unsplit stage's parameters less half of its encoder layer's split ones; its gradients
// and momentum follow (float32), and its activations are not measured.
TEST(MeshMemoryEstimateTest, TensorParallelPipelineRanksHoldHalfTheirStagesSplitLinears) {
  const int64_t num_blocks = static_cast<int64_t>(pipeline_blocks(*make_vit()).size());
  const std::vector<int64_t> one_layer_per_stage{0, 2, num_blocks}; // embedding + layer 0 | rest
  RunMemoryEstimateOptions options = pipeline_options(1);
  options.parallel.pipeline.stages.boundaries(one_layer_per_stage);
  const auto whole = estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(2, 1, 1), options);
  options.parallel.tensor_parallel_size = 2;
  const auto split = estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(2, 1, 2), options);
  ASSERT_TRUE(whole.pipeline && split.pipeline);
  EXPECT_EQ(split.pipeline->boundaries, one_layer_per_stage);
  const int64_t halved = split_numel_per_encoder_layer(testing::small_vit_options()) / 2;
  ASSERT_EQ(split.pipeline->ranks.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    const PipelineRankEstimate& unsplit = whole.pipeline->ranks[r];
    const PipelineRankEstimate& shard = split.pipeline->ranks[r];
    EXPECT_EQ(shard.stages, unsplit.stages);
    EXPECT_EQ(shard.parameter_count, unsplit.parameter_count - halved) << "rank " << r;
    EXPECT_EQ(shard.state.parameters, unsplit.state.parameters - 4 * halved) << "rank " << r;
    EXPECT_EQ(shard.state.gradients, unsplit.state.gradients - 4 * halved) << "rank " << r;
    EXPECT_EQ(shard.state.optimizer_state, unsplit.state.optimizer_state - 4 * halved)
        << "rank " << r;
    EXPECT_FALSE(shard.activations) << "unsplit blocks' activations are not a shard's";
  }
  EXPECT_NE(split.pipeline->activations_not_measured.find("tensor parallelism"), std::string::npos)
      << split.pipeline->activations_not_measured;
}

// Balanced by parameters, the estimate cuts where PipelineParallel cuts the model
// apply_tensor_parallel_plan split (each rank's shard sizes), on 4 ranks (pp 2 x tp 2); the
// unsplit model is cut elsewhere, so the comparison tells the two apart.
TEST(MeshMemoryEstimateTest, TensorParallelPipelineCutIsTheTrainersOfTheSplitModel) {
  const auto split =
      estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(2, 1, 2), pipeline_options(2));
  const auto whole =
      estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(2, 1, 1), pipeline_options(1));
  ASSERT_NE(split.pipeline->boundaries, whole.pipeline->boundaries)
      << "halving the encoder layers' Linears moves the balanced cut";
  run_on_ranks(4, [&](comm::ProcessGroup& world) {
    models::TrunkHeadModel model = make_vit();
    const ParallelOptions parallel = pipeline_options(2).parallel;
    const auto mesh = make_device_mesh(borrow(world), parallel);
    apply_tensor_parallel_plan(*model, *mesh, parallel);
    PipelineParallel trainer(
        pipeline_blocks(*model), mesh->group("pp"), mesh->group("dp"), parallel.pipeline.stages);
    EXPECT_EQ(split.pipeline->boundaries, trainer.boundaries()) << "rank " << world.rank();
  });
}

TEST(MeshMemoryEstimateTest, RefusesATensorParallelPipelineTheTrainerRefuses) {
  RunMemoryEstimateOptions timed = pipeline_options(2);
  timed.parallel.pipeline.stages.balance(StageBalance::kTime);
  try {
    estimate_memory(make_vit().ptr(), pp_dp_tp_dimensions(2, 1, 2), timed);
    FAIL() << "a tensor-parallel pipeline cut by time was sized";
  } catch (const OptionError& error) {
    EXPECT_NE(std::string(error.what()).find("balance"), std::string::npos) << error.what();
  }
}

} // namespace
} // namespace largo::parallel::mesh_memory_estimate_test
