// DINO's model and its loss as the trainer composes them (models/dino_model.h,
// train::SelfSupervisedLoss with LOSS.name dino_loss), against the library pieces called
// directly on the same tensors:
//   - the DinoModel's forward is the student (trunk + dino_head) on every crop, crop-major, and
//     on the first training forward the teacher is the student's copy, run on its crops;
//   - the SelfSupervisedLoss splits that output into the student's and the teacher's rows and
//     returns DinoLoss's value on them at the iteration's teacher temperature;
//   - after the optimizer step the teacher is update_dino_teacher's EMA at
//     dino_teacher_momentum(iteration), and its state (with the center) round-trips.
// Each comparison is of the same float32 operations in the same order, so the values are equal
// bit for bit except where the trunk runs two crops in one batch instead of one at a time
// (the same per-row arithmetic; 1e-6 allows a matmul kernel that blocks the batch differently).
#include <largo/models/dino_head.h>
#include <largo/models/dino_loss.h>
#include <largo/models/dino_model.h>
#include <largo/models/dino_teacher_momentum.h>
#include <largo/models/dino_teacher_update.h>
#include <largo/models/multi_crop_model.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/parallelize.h>
#include <largo/train/self_supervised_loss.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::train::dino_model_test {
namespace {

constexpr double kTolerance = 1e-6;

// Trunk Flatten, Linear(12, 6), ReLU; a dino_head 6 -> 8 -> 4 -> 5 outputs.
models::TrunkHeadModel tiny_student() {
  torch::nn::Sequential trunk(
      torch::nn::Flatten(), torch::nn::Linear(12, 6), torch::nn::Functional(torch::relu));
  models::DinoHeadOptions head;
  head.in_dim = 6;
  head.num_clusters = 5;
  head.hidden_dim = 8;
  head.bottleneck_dim = 4;
  torch::nn::Sequential heads;
  heads->push_back(models::DinoHead(head));
  return models::TrunkHeadModel(models::Trunk{trunk, 6}, heads);
}

// 2 global crops [3, 2, 2] and 2 local ones of the same size (the tiny trunk takes one size).
const std::vector<std::vector<int64_t>> kViews{{3, 2, 2}, {3, 2, 2}, {3, 2, 2}, {3, 2, 2}};

TEST(DinoModel, ForwardIsTheStudentOnEveryCropAndTheTeacherOnItsCrops) {
  torch::manual_seed(0);
  models::TrunkHeadModel student = tiny_student();
  models::DinoModel model(student, tiny_student(), kViews);
  std::vector<at::Tensor> crops;
  for (int i = 0; i < 4; ++i) {
    crops.push_back(torch::randn({3, 3, 2, 2}));
  }
  model->train();
  const at::Tensor output = model->forward(models::pack_views(crops));
  ASSERT_EQ(output.sizes(), at::IntArrayRef({(4 + 2) * 3, 5}));
  EXPECT_TRUE(model->teacher_built());
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 4; ++i) {
    const at::Tensor expected = student->forward(crops[i]);
    EXPECT_LE((output.narrow(0, 3 * i, 3) - expected).abs().max().item<double>(), kTolerance)
        << "student crop " << i;
  }
  for (int i = 0; i < 2; ++i) { // the teacher is the student's copy on its first forward
    const at::Tensor expected = student->forward(crops[i]);
    EXPECT_LE((output.narrow(0, 12 + 3 * i, 3) - expected).abs().max().item<double>(), kTolerance)
        << "teacher crop " << i;
  }
}

TEST(DinoModel, TheLossIsDinoLossOnTheSplitOutputAndTheTeacherFollowsAfterTheStep) {
  torch::manual_seed(1);
  std::shared_ptr<comm::ProcessGroup> group = comm::ProcessGroup::single_process();
  models::DinoModel net(tiny_student(), tiny_student(), kViews);
  optim::ParamGroup params;
  params.lr = 0.5;
  for (const auto& parameter : net->named_parameters()) {
    if (parameter.value().requires_grad()) {
      params.params.push_back(parameter.value());
      params.names.push_back(parameter.key());
    }
  }
  auto model = parallel::parallelize(
      torch::nn::AnyModule(net),
      {params},
      [](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(std::move(groups));
      },
      group,
      parallel::ParallelOptions{});
  SelfSupervisedLossOptions options;
  options.name = "dino_loss";
  options.dino.teacher_temp_warmup_iters = 3;
  options.dino_momentum = 0.7;
  options.dino_max_iteration = 4;
  SelfSupervisedLoss loss(options, 4, *net, *group, 3, 0);
  models::DinoLossOptions direct_options = options.dino;
  direct_options.num_crops = 4;
  direct_options.output_dim = 5;
  models::DinoLoss direct(direct_options);
  for (int64_t iteration = 0; iteration < 3; ++iteration) {
    std::vector<at::Tensor> crops;
    for (int i = 0; i < 4; ++i) {
      crops.push_back(torch::randn({3, 3, 2, 2}));
    }
    loss.start_iteration(iteration);
    at::Tensor value;
    at::Tensor expected;
    model->zero_grad();
    {
      auto scope = model->micro_step(/*synchronize=*/true);
      model->forward_backward(
          models::pack_views(crops),
          at::zeros({3}, at::kLong),
          [&](const at::Tensor& output, const at::Tensor& labels) {
            value = loss.loss(output, labels);
            const at::Tensor detached = output.detach();
            expected = direct.forward(
                detached.narrow(0, 0, 12), detached.narrow(0, 12, 6), iteration, *group);
            return value;
          },
          1);
    }
    EXPECT_EQ(value.item<float>(), expected.item<float>()) << "iteration " << iteration;
    // The teacher after the step: update_dino_teacher on a copy taken before it.
    models::TrunkHeadModel teacher = tiny_student();
    {
      torch::NoGradGuard no_grad;
      const auto state = net->teacher_state_dict();
      for (auto& item : teacher->named_parameters()) {
        item.value().copy_(state.at("teacher." + item.key()));
      }
    }
    ASSERT_TRUE(model->finish_backward(true));
    model->step();
    loss.after_optimizer_step(*model);
    models::update_dino_teacher(*teacher, *net, models::dino_teacher_momentum(0.7, iteration, 4));
    const auto state = net->teacher_state_dict();
    for (const auto& item : teacher->named_parameters()) {
      EXPECT_TRUE(torch::equal(state.at("teacher." + item.key()), item.value()))
          << item.key() << " at iteration " << iteration;
    }
  }
  // The loss state (center, teacher) round-trips into a fresh model and loss.
  models::DinoModel other(tiny_student(), tiny_student(), kViews);
  SelfSupervisedLoss other_loss(options, 4, *other, *group, 3, 0);
  other_loss.load_state_dict(loss.state_dict());
  const auto saved = loss.state_dict();
  const auto loaded = other_loss.state_dict();
  ASSERT_EQ(saved.size(), loaded.size());
  for (const auto& [name, value] : saved) {
    EXPECT_TRUE(torch::equal(loaded.at(name), value)) << name;
  }
  EXPECT_TRUE(other->teacher_built());
}

} // namespace
} // namespace largo::train::dino_model_test
