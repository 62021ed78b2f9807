// Checkpoints of a pipeline, its forward-only path and its failure mode (Gloo on 127.0.0.1):
// the gathered full state is the single-process model's state dict; a run resumes from its
// stages' parts bit for bit, and from a full checkpoint at another pipeline size or without
// a pipeline; a stage that dies stops its neighbour with a message naming it.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/error.h>
#include <largo/parallel/pipeline/pipeline_checkpoint.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>

#include "comm/distributed_test_util.h"
#include "parallel/pipeline_test_util.h"

namespace largo::parallel::pipeline_checkpoint_test {
namespace {

using namespace largo::parallel::testing;
using largo::testing::run_on_ranks;

constexpr int64_t kBatch = 16;

PipelineParallelOptions one_f_one_b() {
  return PipelineParallelOptions().num_microbatches(4);
}

void train_steps(PipelineParallel& pipeline, optim::Optimizer& optimizer, int first, int last) {
  for (int step = first; step < last; ++step) {
    auto [images, labels] = global_batch(step, kBatch);
    optimizer.zero_grad();
    pipeline.forward_backward(images, labels, cross_entropy);
    pipeline.reduce_gradients();
    optimizer.step();
  }
}

// Each stage saves its own part (model and optimizer, by full-model names) after 2 steps; a
// fresh pipeline, built from another initialisation, loads them and takes 2 more steps:
// bit for bit what an uninterrupted run gives.
TEST(PipelineCheckpointTest, ResumesFromTheStagesPartsBitForBit) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto model = make_model();
    PipelineParallel uninterrupted(pipeline_blocks(*model), borrow(group), nullptr, one_f_one_b());
    auto sgd = make_sgd(*uninterrupted.module());
    train_steps(uninterrupted, *sgd, 0, 2);
    // The parts, as a checkpoint would hold them (pickled and read back).
    const auto model_part = torch::pickle_load(torch::pickle_save(uninterrupted.state_dict()));
    const auto optimizer_part = torch::pickle_load(torch::pickle_save(sgd->state_dict()));
    train_steps(uninterrupted, *sgd, 2, 4);

    auto other = make_model(/*seed=*/77);
    PipelineParallel resumed(pipeline_blocks(*other), borrow(group), nullptr, one_f_one_b());
    auto resumed_sgd = make_sgd(*resumed.module());
    resumed.load_state_dict(model_part.toGenericDict());
    resumed_sgd->load_state_dict(optimizer_part);
    train_steps(resumed, *resumed_sgd, 2, 4);
    for (const auto& entry : uninterrupted.state_dict()) {
      EXPECT_TRUE(entry.value().toTensor().equal(resumed.state_dict().at(entry.key()).toTensor()))
          << entry.key().toStringRef();
    }
  });
}

// The full state gathered on pipeline rank 0 is a plain state dict of the whole model: a
// non-pipelined model and optimizer load it and go on as the pipeline goes on, and a
// pipeline of another size (here 1, in one process) selects its part of it.
TEST(PipelineCheckpointTest, FullStateResumesWithoutAPipelineAndAtAnotherSize) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto model = make_model();
    PipelineParallel pipeline(pipeline_blocks(*model), borrow(group), nullptr, one_f_one_b());
    auto sgd = make_sgd(*pipeline.module());
    train_steps(pipeline, *sgd, 0, 2);
    const auto full_model = pipeline.full_state_dict();
    const auto full_optimizer = full_optimizer_state_dict(pipeline, *sgd);
    train_steps(pipeline, *sgd, 2, 3);
    if (group.rank() != 0) {
      EXPECT_EQ(full_model.size(), 0u);
      return;
    }
    // Without a pipeline: the full model's own names and order.
    auto plain = make_model(/*seed=*/77);
    std::vector<std::string> names;
    for (const auto& item : plain->named_parameters()) {
      names.push_back(item.key());
    }
    ASSERT_EQ(full_model.size(), names.size());
    size_t i = 0;
    for (const auto& entry : full_model) {
      EXPECT_EQ(entry.key().toStringRef(), names[i++]);
    }
    for (const auto& item : plain->named_parameters()) {
      torch::NoGradGuard no_grad;
      item.value().copy_(full_model.at(item.key()).toTensor());
    }
    auto plain_sgd = make_sgd(*plain);
    plain_sgd->load_state_dict(full_optimizer);
    auto [images, labels] = global_batch(2, kBatch);
    plain_sgd->zero_grad();
    cross_entropy(plain->forward(images), labels).backward();
    plain_sgd->step();
    EXPECT_LT(max_difference(pipeline, *plain), 1e-5); // reassociation only, 1 step

    // A pipeline of one rank: takes its (whole) part of the full state.
    auto single_model = make_model(/*seed=*/78);
    PipelineParallel single(
        pipeline_blocks(*single_model),
        comm::ProcessGroup::single_process(),
        nullptr,
        one_f_one_b());
    auto single_sgd = make_sgd(*single.module());
    single.load_state_dict(full_model);
    single_sgd->load_state_dict(
        select_optimizer_state(full_optimizer, single.full_parameter_names()));
    train_steps(single, *single_sgd, 2, 3);
    EXPECT_LT(max_difference(pipeline, *single.module()), 1e-5);

    // A state missing this stage's entries is refused, naming them.
    c10::impl::GenericDict partial(c10::StringType::get(), c10::TensorType::get());
    try {
      single.load_state_dict(partial);
      ADD_FAILURE() << "no error";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("'trunk.0.linear.weight' missing"), std::string::npos)
          << e.what();
    }
  });
}

// Evaluation: outputs on the last stage, or on every rank with broadcast_outputs, equal to
// the model's own forward.
TEST(PipelineCheckpointTest, ForwardOnlyGivesTheModelsOutputs) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto reference = make_model();
    auto [images, labels] = global_batch(0, 10);
    const at::Tensor expected = reference->forward(images).detach();
    auto model = make_model();
    PipelineParallel pipeline(
        pipeline_blocks(*model),
        borrow(group),
        nullptr,
        one_f_one_b().num_microbatches(3)); // 4, 3, 3 rows
    const at::Tensor last_only = pipeline.forward(images);
    EXPECT_EQ(last_only.defined(), group.rank() == 1);
    if (last_only.defined()) {
      EXPECT_TRUE(at::allclose(last_only, expected, 1e-6, 1e-6));
    }
    const at::Tensor everywhere = pipeline.forward(images, /*broadcast_outputs=*/true);
    EXPECT_TRUE(at::allclose(everywhere, expected, 1e-6, 1e-6));
    EXPECT_FALSE(everywhere.requires_grad());
  });
}

// Stage 1 exits after joining; stage 0's step fails within the collective timeout with a
// CommError that names stage 1 and its job rank.
TEST(PipelineCheckpointTest, ADeadStageIsNamedByItsNeighbour) {
  largo::testing::RankRunOptions options;
  options.collective_timeout = std::chrono::seconds(10);
  run_on_ranks(
      2,
      [](comm::ProcessGroup& group) {
        auto model = make_model();
        PipelineParallel pipeline(pipeline_blocks(*model), borrow(group), nullptr, one_f_one_b());
        group.barrier();
        if (group.rank() == 1) {
          std::_Exit(0); // dies without a word
        }
        auto [images, labels] = global_batch(0, kBatch);
        try {
          pipeline.forward_backward(images, labels, cross_entropy);
          ADD_FAILURE() << "the step went through without stage 1";
        } catch (const CommError& e) {
          const std::string message = e.what();
          EXPECT_NE(message.find("stage 1 (pipeline rank 1, job rank 1)"), std::string::npos)
              << message;
        }
      },
      options);
}

} // namespace
} // namespace largo::parallel::pipeline_checkpoint_test
