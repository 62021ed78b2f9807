// MoCo through the library as a libtorch user composes it (docs/self_supervised.md, "MoCo from
// C++"): a MocoModel under parallelize()'s DDP with SelfSupervisedLoss, at 2 ranks, against
// VISSL's formulas on the global batch (tests/reference/gen_moco_baselines.py, case
// train_two_ranks_shuffled: each rank's BatchNorm on its own rows, the keys' batch shuffled
// across the ranks, the queue filled with the keys gathered from both ranks, the ranks'
// gradients averaged, SGD).
#include <largo/models/moco_model.h>
#include <largo/models/multi_crop_model.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/parallelize.h>
#include <largo/train/self_supervised_loss.h>

#include "comm/distributed_test_util.h"
#include "models/model_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>

namespace largo::train::moco_under_ddp_test {
namespace {

// A JSON number list (a bias) or list of rows (a weight) as a float32 tensor.
at::Tensor json_tensor(const nlohmann::json& value) {
  if (!value.empty() && value.front().is_array()) {
    return models::testing::json_matrix(value).to(at::kFloat);
  }
  return torch::tensor(value.get<std::vector<double>>(), torch::kFloat64).to(at::kFloat);
}

// The reference's tiny model: trunk Flatten, Linear(8, 6), BatchNorm1d(6), ReLU; head
// Linear(6, 4); parameters loaded from the baseline by name.
models::TrunkHeadModel tiny_model(const nlohmann::json& values) {
  torch::nn::Sequential trunk(
      torch::nn::Flatten(),
      torch::nn::Linear(8, 6),
      torch::nn::BatchNorm1d(6),
      torch::nn::Functional(torch::relu));
  torch::nn::Sequential head(torch::nn::Linear(6, 4));
  models::TrunkHeadModel model(models::Trunk{trunk, 6}, head);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    item.value().copy_(json_tensor(values.at(item.key())));
  }
  return model;
}

double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// float32 against float32, as tests/models/moco_test.cpp's kTrainTolerance argues (measured
// there at one process: 1.2e-7 on a loss, 2.4e-7 on a parameter); DDP's all-reduce adds one
// rounding of a 2-term sum per gradient.
constexpr double kTolerance = 2e-5;

TEST(MocoUnderDdpTest, TwoRanksTrainAsVisslsFormulaOnTheGlobalBatch) {
  const nlohmann::json entry = models::testing::baseline_case(
      "moco_baselines.json", "gen_moco_baselines.py", "train_two_ranks_shuffled");
  largo::testing::run_on_ranks(2, [&](comm::ProcessGroup& group) {
    auto world = std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
    const int64_t n = entry.at("n_per_rank");
    models::MocoModelOptions moco;
    moco.momentum = entry.at("momentum");
    moco.shuffle_seed = entry.at("shuffle_seed");
    const std::vector<std::vector<int64_t>> views{{2, 2, 2}, {2, 2, 2}};
    models::MocoModel net(
        tiny_model(entry.at("initial")), tiny_model(entry.at("final")), views, moco);
    net->set_process_group(world);
    optim::ParamGroup params;
    params.lr = entry.at("lr");
    for (const auto& parameter : net->named_parameters()) {
      params.params.push_back(parameter.value());
      params.names.push_back(parameter.key());
    }
    parallel::ParallelOptions options;
    options.data_parallelism = parallel::DataParallelism::kDdp;
    auto model = parallel::parallelize(
        torch::nn::AnyModule(net),
        {params},
        [](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::SGD>(std::move(groups));
        },
        world,
        options);

    SelfSupervisedLossOptions ssl;
    ssl.name = "moco_loss";
    ssl.moco.temperature = entry.at("temperature");
    ssl.moco_queue_size = entry.at("queue_size");
    ssl.moco_embedding_dim = 4;
    SelfSupervisedLoss loss(ssl, 2, *model->module(), group, n, /*seed=*/0);
    std::map<std::string, at::Tensor> state = loss.state_dict(); // the reference's queue
    state["queue"] = models::testing::json_matrix(entry.at("initial_queue")).to(at::kFloat);
    loss.load_state_dict(state);

    const auto& batches = entry.at("batches");
    for (size_t step = 0; step < batches.size(); ++step) {
      const int64_t first = group.rank() * n;
      const at::Tensor view0 = json_tensor(batches[step].at("view0")).narrow(0, first, n);
      const at::Tensor view1 = json_tensor(batches[step].at("view1")).narrow(0, first, n);
      const at::Tensor input =
          models::pack_views({view0.view({n, 2, 2, 2}), view1.view({n, 2, 2, 2})});
      model->zero_grad();
      double value = 0.0;
      {
        auto scope = model->micro_step(/*synchronize=*/true);
        value = model->forward_backward(
            input,
            torch::zeros({n}, at::kLong),
            [&](const at::Tensor& out, const at::Tensor& y) { return loss.loss(out, y); },
            1);
      }
      ASSERT_TRUE(model->finish_backward(true));
      model->step();
      const double expected = entry.at("losses")[step][group.rank()];
      EXPECT_NEAR(value, expected, kTolerance) << "step " << step;
    }
    for (const auto& item : net->named_parameters()) {
      EXPECT_LE(
          max_abs_difference(item.value(), json_tensor(entry.at("final").at(item.key()))),
          kTolerance)
          << item.key();
    }
    for (const auto& item : net->momentum_encoder()->named_parameters()) {
      EXPECT_LE(
          max_abs_difference(item.value(), json_tensor(entry.at("final_momentum").at(item.key()))),
          kTolerance)
          << "momentum encoder " << item.key();
    }
    const std::map<std::string, at::Tensor> final_state = loss.state_dict();
    EXPECT_LE(
        max_abs_difference(
            final_state.at("queue"), models::testing::json_matrix(entry.at("final_queue"))),
        kTolerance);
    EXPECT_EQ(
        final_state.at("queue_ptr").item<int64_t>(), entry.at("final_queue_ptr").get<int64_t>());
  });
}

} // namespace
} // namespace largo::train::moco_under_ddp_test
