// MoCo's loss, queue and momentum encoder against VISSL's formulas
// (tests/reference/gen_moco_baselines.py): the loss and its gradient in float64, the initial
// queue drawn from a seeded generator, and a few SGD steps of a tiny model on one process and
// on 2 ranks with the keys' batch shuffled (each rank's BatchNorm on its own rows, gradients
// averaged as DDP does).
#include <largo/comm/process_group.h>
#include <largo/core/error.h>
#include <largo/models/moco_loss.h>
#include <largo/models/moco_model.h>
#include <largo/models/moco_queue.h>
#include <largo/models/multi_crop_model.h>

#include "comm/distributed_test_util.h"
#include "model_test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>

namespace largo::models::moco_test {
namespace {

nlohmann::json baseline_case(const std::string& name) {
  return testing::baseline_case("moco_baselines.json", "gen_moco_baselines.py", name);
}

at::Tensor matrix(const nlohmann::json& rows) {
  return testing::json_matrix(rows);
}

// A JSON number list (a bias) or list of rows (a weight) as a float32 tensor.
at::Tensor json_tensor(const nlohmann::json& value) {
  if (!value.empty() && value.front().is_array()) {
    return matrix(value).to(at::kFloat);
  }
  return torch::tensor(value.get<std::vector<double>>(), torch::kFloat64).to(at::kFloat);
}

double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// float64 on both sides, the same operations in another order (VISSL's einsums and
// cross_entropy against a logsumexp): rounding only, 1e-15 per operation over sums of at most
// 13 terms of size 1 / temperature <= 15, so 1e-12 leaves a factor of ~10 of room; a wrong
// positive or an unnormalised query moves the loss by 1e-2 or more. Measured (2026-11-29): 2e-16
// relative on the losses, 3e-16 on the gradients.
constexpr double kLossTolerance = 1e-12;

TEST(MocoLoss, MatchesVissl) {
  for (const char* name : {"loss_t0_2", "loss_t0_07"}) {
    SCOPED_TRACE(name);
    const nlohmann::json entry = baseline_case(name);
    at::Tensor query = matrix(entry.at("query")).requires_grad_();
    const at::Tensor loss = moco_loss(
        query, matrix(entry.at("key")), matrix(entry.at("queue")), {entry.at("temperature")});
    loss.backward();
    const double expected = entry.at("loss");
    EXPECT_NEAR(loss.item<double>(), expected, kLossTolerance * std::abs(expected));
    EXPECT_LE(max_abs_difference(query.grad(), matrix(entry.at("query_gradient"))), kLossTolerance);
  }
}

TEST(MocoLoss, BadShapesAndTemperatureAreErrors) {
  const at::Tensor q = torch::randn({3, 4});
  EXPECT_THROW(moco_loss(q, torch::randn({2, 4}), torch::randn({4, 8})), Error);
  EXPECT_THROW(moco_loss(q, q, torch::randn({5, 8})), Error);
  EXPECT_THROW(moco_loss(q, q, torch::randn({4, 8}), {0.0}), OptionError);
}

// The same generator and the same kernels as torch.randn and F.normalize: equal to float32
// rounding of the norm's sum (4 terms), 1e-6 of values below 1.
TEST(MocoQueue, StartsAsVisslsSeededDraw) {
  const nlohmann::json entry = baseline_case("initial_queue");
  const MocoQueue queue(
      {entry.at("embedding_dim"), entry.at("size")},
      at::make_generator<at::CPUGeneratorImpl>(entry.at("seed").get<uint64_t>()));
  EXPECT_LE(max_abs_difference(queue.keys(), matrix(entry.at("queue"))), 1e-6);
  EXPECT_EQ(queue.pointer(), 0);
}

// Closed form: rank r enqueues keys filled with r; the gathered batch lands in rank order at
// the pointer, which wraps round robin; a queue that is not a multiple of the global batch
// is refused as VISSL asserts.
TEST(MocoQueue, EnqueuesKeysGatheredInRankOrder) {
  largo::testing::run_on_ranks(2, [](comm::ProcessGroup& group) {
    MocoQueue queue({3, 8}, at::make_generator<at::CPUGeneratorImpl>(1));
    const at::Tensor initial = queue.keys().clone();
    const double r = group.rank();
    queue.enqueue(torch::full({2, 3}, r + 10), group); // columns 0-3: 10, 10, 11, 11
    EXPECT_EQ(queue.pointer(), 4);
    const at::Tensor expected_front = torch::tensor({10.0, 10.0, 11.0, 11.0}).expand({3, 4});
    EXPECT_TRUE(queue.keys().narrow(1, 0, 4).equal(expected_front.to(at::kFloat)));
    EXPECT_TRUE(queue.keys().narrow(1, 4, 4).equal(initial.narrow(1, 4, 4)));
    queue.enqueue(torch::full({2, 3}, r + 20), group);
    EXPECT_EQ(queue.pointer(), 0);
    queue.enqueue(torch::full({2, 3}, r + 30), group);
    EXPECT_EQ(queue.keys()[0][0].item<float>(), 30.0f);
    EXPECT_EQ(queue.keys()[0][6].item<float>(), 21.0f); // the second enqueue's, rank 1's
    EXPECT_THROW(queue.enqueue(torch::zeros({3, 3}), group), OptionError); // 6 keys into 8
  });
}

TEST(MocoQueue, StateRoundTripsAndRefusesAnotherShape) {
  MocoQueue queue({3, 4}, at::make_generator<at::CPUGeneratorImpl>(1));
  auto group = comm::ProcessGroup::single_process();
  queue.enqueue(torch::ones({2, 3}), *group);
  MocoQueue restored({3, 4}, at::make_generator<at::CPUGeneratorImpl>(2));
  restored.load_state_dict(queue.state_dict());
  EXPECT_TRUE(restored.keys().equal(queue.keys()));
  EXPECT_EQ(restored.pointer(), 2);
  MocoQueue other({3, 8}, at::make_generator<at::CPUGeneratorImpl>(1));
  EXPECT_THROW(other.load_state_dict(queue.state_dict()), CheckpointError);
}

const std::vector<std::vector<int64_t>> kTwoViews{{2, 2, 2}, {2, 2, 2}};
const std::vector<std::vector<int64_t>> kOneView{{2, 2, 2}};

// The reference's tiny model: trunk Flatten, Linear(8, 6), BatchNorm1d(6), ReLU; head
// Linear(6, 4); parameters loaded from the baseline by name.
TrunkHeadModel tiny_model(const nlohmann::json& values) {
  torch::nn::Sequential trunk(
      torch::nn::Flatten(),
      torch::nn::Linear(8, 6),
      torch::nn::BatchNorm1d(6),
      torch::nn::Functional(torch::relu));
  torch::nn::Sequential head(torch::nn::Linear(6, 4));
  TrunkHeadModel model(Trunk{trunk, 6}, head);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    item.value().copy_(json_tensor(values.at(item.key())));
  }
  return model;
}

// float32 through a few steps: each value is a short chain of sums of <= 8 products (float32
// rounding 6e-8 each), a logsumexp over 9 logits scaled by 1 / 0.2, and 4 SGD steps of lr 0.5
// that carry the differences along; 2e-5 absolute (values of order 1) leaves room for the
// different summation orders of oneDNN/MKL and PyTorch's, while a missed momentum update
// (0.1 of a step's change) or a key of the wrong image moves values by 1e-3 or more (keys put
// back in the shuffled order: losses off by 0.15 to 0.9). Measured at one process
// (2026-11-29): 1.2e-7 on a loss, 2.4e-7 on a parameter, 6e-8 on the momentum encoder, 1.3e-7
// on the queue.
constexpr double kTrainTolerance = 2e-5;

void train_like_reference(const nlohmann::json& entry, comm::ProcessGroup& group) {
  const int world = entry.at("world_size");
  const int64_t n = entry.at("n_per_rank");
  const TrunkHeadModel query = tiny_model(entry.at("initial"));
  MocoModelOptions options;
  options.momentum = entry.at("momentum");
  options.shuffle_seed = entry.at("shuffle_seed");
  // The momentum encoder starts with other values: the first forward copies the query's.
  MocoModel model(query, tiny_model(entry.at("final")), kTwoViews, options);
  if (world > 1) {
    model->set_process_group(std::shared_ptr<comm::ProcessGroup>(&group, [](auto*) {}));
  }
  MocoQueue queue({4, entry.at("queue_size")}, at::make_generator<at::CPUGeneratorImpl>(0));
  queue.load_state_dict(
      {{"queue", matrix(entry.at("initial_queue")).to(at::kFloat)},
       {"queue_ptr", torch::zeros({1}, at::kLong)}});
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(entry.at("lr")));
  const auto& batches = entry.at("batches");
  for (size_t step = 0; step < batches.size(); ++step) {
    const int64_t first = group.rank() * n;
    const at::Tensor view0 = json_tensor(batches[step].at("view0")).narrow(0, first, n);
    const at::Tensor view1 = json_tensor(batches[step].at("view1")).narrow(0, first, n);
    sgd.zero_grad();
    const at::Tensor output =
        model->forward(pack_views({view0.view({n, 2, 2, 2}), view1.view({n, 2, 2, 2})}));
    const at::Tensor loss = moco_loss(
        output.narrow(1, 0, 4), output.narrow(1, 4, 4), queue.keys(), {entry.at("temperature")});
    queue.enqueue(output.narrow(1, 4, 4), group);
    loss.backward();
    for (auto& parameter : model->parameters()) { // DDP's average
      group.all_reduce(parameter.mutable_grad());
      parameter.mutable_grad().div_(world);
    }
    sgd.step();
    const double expected = entry.at("losses")[step][group.rank()];
    EXPECT_NEAR(loss.item<double>(), expected, kTrainTolerance) << "step " << step;
  }
  for (const auto& item : model->named_parameters()) {
    EXPECT_LE(
        max_abs_difference(item.value(), json_tensor(entry.at("final").at(item.key()))),
        kTrainTolerance)
        << item.key();
  }
  for (const auto& item : model->momentum_encoder()->named_parameters()) {
    EXPECT_LE(
        max_abs_difference(item.value(), json_tensor(entry.at("final_momentum").at(item.key()))),
        kTrainTolerance)
        << "momentum encoder " << item.key();
  }
  EXPECT_LE(max_abs_difference(queue.keys(), matrix(entry.at("final_queue"))), kTrainTolerance);
  EXPECT_EQ(queue.pointer(), entry.at("final_queue_ptr").get<int64_t>());
  EXPECT_EQ(model->num_forwards(), static_cast<int64_t>(batches.size()));
}

TEST(MocoModel, TrainsLikeVisslOnOneProcess) {
  const nlohmann::json entry = baseline_case("train_one_rank");
  auto group = comm::ProcessGroup::single_process();
  train_like_reference(entry, *group);
}

// The keys' batch shuffled across 2 ranks: each rank's momentum-encoder BatchNorm sees a
// shuffled half of the global batch (the permutation VISSL would draw from the same seed), and
// the keys come back in image order.
TEST(MocoModel, TwoRanksWithShuffledKeysTrainLikeVissl) {
  const nlohmann::json entry = baseline_case("train_two_ranks_shuffled");
  largo::testing::run_on_ranks(
      2, [&](comm::ProcessGroup& group) { train_like_reference(entry, group); });
}

TEST(MocoModel, MomentumStateRoundTripsAndOptionsAreChecked) {
  const nlohmann::json entry = baseline_case("train_one_rank");
  MocoModel model(tiny_model(entry.at("initial")), tiny_model(entry.at("final")), kTwoViews);
  model->forward(torch::randn({4, 16}));
  MocoModel restored(tiny_model(entry.at("initial")), tiny_model(entry.at("initial")), kTwoViews);
  restored->load_momentum_state_dict(model->momentum_state_dict());
  EXPECT_EQ(restored->num_forwards(), 1);
  for (const auto& [name, value] : model->momentum_state_dict()) {
    EXPECT_TRUE(value.equal(restored->momentum_state_dict().at(name))) << name;
  }
  MocoModelOptions bad;
  bad.momentum = 1.5;
  EXPECT_THROW(
      MocoModel(tiny_model(entry.at("initial")), tiny_model(entry.at("initial")), kTwoViews, bad),
      OptionError);
  EXPECT_THROW(
      MocoModel(tiny_model(entry.at("initial")), tiny_model(entry.at("initial")), kOneView),
      ConfigError);
}

} // namespace
} // namespace largo::models::moco_test
