// DeepCluster v2's loss, memory and distributed k-means against VISSL's formulas
// (tests/reference/gen_deepclusterv2_baselines.py): the loss and its gradient in float64, and
// three epochs of a tiny model (the initial memory pass, the k-means at each epoch's start,
// the loss and memory update of every step) on one process and at 2 ranks; then the k-means of
// 2 ranks against one process on the whole data, from the same initial centroids.
#include <largo/comm/process_group.h>
#include <largo/core/error.h>
#include <largo/models/deepclusterv2_loss.h>
#include <largo/models/deepclusterv2_memory.h>

#include "comm/distributed_test_util.h"
#include "model_test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace largo::models::deepclusterv2_test {
namespace {

nlohmann::json baseline_case(const std::string& name) {
  return testing::baseline_case(
      "deepclusterv2_baselines.json", "gen_deepclusterv2_baselines.py", name);
}

at::Tensor matrix(const nlohmann::json& rows) {
  return testing::json_matrix(rows);
}

at::Tensor json_tensor(const nlohmann::json& value) {
  return testing::json_float_tensor(value);
}

at::Tensor json_longs(const nlohmann::json& value) {
  return torch::tensor(value.get<std::vector<int64_t>>(), torch::kLong);
}

using testing::max_abs_difference;

// float64 on both sides, the same ATen cross-entropy on the same scores; only the
// normalisation and the mean over heads may round differently: 1e-15 per operation on values
// below 1 / temperature = 10, over sums of at most 8 rows, so 1e-12 keeps a factor of ~10;
// an ignored target counted, or a missing normalisation, moves the loss by 1e-2 or more.
// Measured (2026-11-30): 0, on the loss and every gradient entry.
constexpr double kLossTolerance = 1e-12;

TEST(DeepClusterV2Loss, MatchesVissl) {
  for (const char* name : {"loss_three_heads", "loss_one_head"}) {
    SCOPED_TRACE(name);
    const nlohmann::json entry = baseline_case(name);
    at::Tensor embeddings = matrix(entry.at("embeddings")).requires_grad_();
    std::vector<at::Tensor> centroids;
    for (const auto& c : entry.at("centroids")) {
      centroids.push_back(matrix(c));
    }
    std::vector<at::Tensor> rows;
    for (const auto& t : entry.at("targets")) {
      rows.push_back(json_longs(t));
    }
    const at::Tensor loss =
        deepclusterv2_loss(embeddings, centroids, torch::stack(rows), {entry.at("temperature")});
    loss.backward();
    const double expected = entry.at("loss");
    EXPECT_NEAR(loss.item<double>(), expected, kLossTolerance * std::abs(expected));
    EXPECT_LE(max_abs_difference(embeddings.grad(), matrix(entry.at("gradient"))), kLossTolerance);
  }
}

TEST(DeepClusterV2Loss, BadShapesAndTemperatureAreErrors) {
  const at::Tensor e = torch::randn({4, 3});
  const at::Tensor targets = torch::zeros({1, 4}, torch::kLong);
  EXPECT_THROW(deepclusterv2_loss(e, {torch::randn({2, 5})}, targets), Error);
  EXPECT_THROW(
      deepclusterv2_loss(e, {torch::randn({2, 3})}, torch::zeros({2, 4}, torch::kLong)), Error);
  EXPECT_THROW(deepclusterv2_loss(e, {}, targets), Error);
  EXPECT_THROW(deepclusterv2_loss(e, {torch::randn({2, 3})}, targets, {0.0}), OptionError);
}

// The reference's tiny model (Linear(6, 5), Tanh, Linear(5, 4)) with its initial values.
torch::nn::Sequential tiny_model(const nlohmann::json& values) {
  torch::nn::Sequential model(
      torch::nn::Linear(6, 5), torch::nn::Functional(torch::tanh), torch::nn::Linear(5, 4));
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    item.value().copy_(json_tensor(values.at(item.key())));
  }
  return model;
}

DeepClusterV2MemoryOptions memory_options(const nlohmann::json& entry) {
  DeepClusterV2MemoryOptions options;
  options.num_clusters = entry.at("num_clusters").get<std::vector<int64_t>>();
  options.kmeans_iters = entry.at("kmeans_iters");
  options.crops_for_mb = entry.at("crops_for_mb").get<std::vector<int64_t>>();
  options.embedding_dim = 4;
  options.num_crops = entry.at("num_crops");
  options.num_samples = entry.at("num_samples");
  options.memory_size_per_rank = entry.at("memory_size_per_rank");
  return options;
}

// Every bank of this rank against the reference's [banks, size, d].
void expect_banks(
    const DeepClusterV2Memory& memory, const nlohmann::json& banks, double tolerance) {
  for (int64_t bank = 0; bank < memory.embeddings().size(0); ++bank) {
    EXPECT_LE(max_abs_difference(memory.embeddings()[bank], matrix(banks[bank])), tolerance)
        << "bank " << bank;
  }
}

// float32 through three epochs. The k-means' sums of up to 12 unit rows are added in another
// order than VISSL's torch.sum (index_add_: one row after another), so a centroid may differ by
// ~12 float32 roundings (12 * 6e-8 = 7e-7); the scores divide it by the temperature 0.1
// (7e-6), and 12 SGD steps of lr 0.2 carry such differences along: 2e-5 absolute on values of
// order 1. Assignments must be equal (one changed assignment moves a loss by 1e-1 or more, as
// would a k-means from the wrong bank or rank). Measured (2026-11-30, this 2-core Xeon): 0 on
// every loss, centroid, parameter and memory row, at 1 and at 2 ranks: on these sizes
// index_add_ and torch.sum add the rows in the same order.
constexpr double kTrainTolerance = 2e-5;

void train_like_reference(const nlohmann::json& entry, comm::ProcessGroup& group) {
  const int world = entry.at("world_size");
  const int rank = group.rank();
  const int64_t num_crops = entry.at("num_crops");
  torch::nn::Sequential model = tiny_model(entry.at("initial"));
  DeepClusterV2Memory memory(memory_options(entry));
  std::vector<at::Tensor> crop_rows; // [crops][N, 6]
  for (const auto& crop : entry.at("crops")) {
    crop_rows.push_back(json_tensor(crop));
  }
  const at::Tensor crops = torch::stack(crop_rows);
  const auto inputs = [&](const at::Tensor& indexes) { // crop-major, multicrop_collator's order
    std::vector<at::Tensor> views;
    for (int64_t c = 0; c < num_crops; ++c) {
      views.push_back(crops[c].index_select(0, indexes));
    }
    return torch::cat(views);
  };
  const auto& batches = entry.at("batches");
  { // VISSL's init_memory: one pass over epoch 0's batches
    torch::NoGradGuard no_grad;
    for (const auto& batch : batches[0][rank]) {
      const at::Tensor indexes = json_longs(batch);
      memory.write(model->forward(inputs(indexes)), indexes);
    }
  }
  expect_banks(memory, entry.at("initial_memory")[rank], 1e-6);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(entry.at("lr")));
  const DeepClusterV2LossOptions loss_options{entry.at("temperature")};
  int64_t global_step = 0;
  for (int64_t epoch = 0; epoch < entry.at("epochs").get<int64_t>(); ++epoch) {
    memory.cluster(
        group,
        at::make_generator<at::CPUGeneratorImpl>(entry.at("kmeans_seed").get<uint64_t>() + epoch));
    const auto& clustering = entry.at("clusterings")[epoch];
    EXPECT_TRUE(memory.assignments().equal(json_tensor(clustering.at("assignments")).to(at::kLong)))
        << "epoch " << epoch;
    for (size_t h = 0; h < memory.centroids().size(); ++h) {
      EXPECT_LE(
          max_abs_difference(memory.centroids()[h], matrix(clustering.at("centroids")[h])),
          kTrainTolerance)
          << "epoch " << epoch << " head " << h;
    }
    for (const auto& batch : batches[epoch][rank]) {
      const at::Tensor indexes = json_longs(batch);
      sgd.zero_grad();
      const at::Tensor output = model->forward(inputs(indexes));
      const at::Tensor loss =
          deepclusterv2_loss(output, memory.centroids(), memory.targets(indexes), loss_options);
      memory.write(output, indexes);
      (loss / world).backward();
      for (auto& parameter : model->parameters()) { // DDP's average (the loss divided above)
        group.all_reduce(parameter.mutable_grad());
      }
      sgd.step();
      const double expected = entry.at("losses")[global_step++][rank];
      EXPECT_NEAR(loss.item<double>(), expected, kTrainTolerance) << "epoch " << epoch;
    }
  }
  for (const auto& item : model->named_parameters()) {
    EXPECT_LE(
        max_abs_difference(item.value(), json_tensor(entry.at("final").at(item.key()))),
        kTrainTolerance)
        << item.key();
  }
  expect_banks(memory, entry.at("final_memory")[rank], kTrainTolerance);
  EXPECT_TRUE(memory.sample_indexes().equal(json_longs(entry.at("final_memory_index")[rank])));
}

TEST(DeepClusterV2Memory, TrainsLikeVisslOnOneProcess) {
  const nlohmann::json entry = baseline_case("train_one_rank");
  auto group = comm::ProcessGroup::single_process();
  train_like_reference(entry, *group);
}

// Each rank clusters its own bank: the initial centroids from rank 0's, the counts and sums
// all-reduced, every rank's assignments gathered (some images in no bank stay -100).
TEST(DeepClusterV2Memory, TwoRanksTrainLikeVissl) {
  const nlohmann::json entry = baseline_case("train_two_ranks");
  largo::testing::run_on_ranks(
      2, [&](comm::ProcessGroup& group) { train_like_reference(entry, group); });
}

// 40 unit rows, split 24 / 16 over 2 ranks, clustered from the same initial centroids as one
// process on all 40. The only difference is each cluster's sum added as two partial sums, ~40
// float32 roundings of unit rows at most (2.4e-6) before the normalisation: 1e-5 on the
// centroids; the assignments must be equal. Measured (2026-11-30): 6e-8 on the centroids.
TEST(DistributedSphericalKmeans, TwoRanksEqualOneProcessOnTheWholeData) {
  largo::testing::run_on_ranks(2, [](comm::ProcessGroup& group) {
    at::Tensor rows = torch::randn({40, 5}, at::make_generator<at::CPUGeneratorImpl>(3));
    rows = rows / rows.norm(2, 1, true);
    const at::Tensor initial = rows.narrow(0, 30, 6).clone();
    auto one_process = comm::ProcessGroup::single_process();
    const SphericalKmeansResult whole =
        distributed_spherical_kmeans(rows, initial, 8, *one_process);
    const int64_t first = group.rank() == 0 ? 0 : 24;
    const int64_t count = group.rank() == 0 ? 24 : 16;
    const SphericalKmeansResult mine =
        distributed_spherical_kmeans(rows.narrow(0, first, count), initial, 8, group);
    EXPECT_LE(max_abs_difference(mine.centroids, whole.centroids), 1e-5);
    EXPECT_TRUE(mine.assignments.equal(whole.assignments.narrow(0, first, count)));
    // Not trivially equal: the centroids moved, and several clusters have members.
    EXPECT_GT(max_abs_difference(whole.centroids, initial), 1e-2);
    EXPECT_GT(std::get<0>(at::_unique(whole.assignments)).numel(), 2);
  });
}

DeepClusterV2MemoryOptions small_options() {
  DeepClusterV2MemoryOptions options;
  options.num_clusters = {2, 3};
  options.kmeans_iters = 2;
  options.crops_for_mb = {1};
  options.embedding_dim = 3;
  options.num_crops = 2;
  options.num_samples = 10;
  options.memory_size_per_rank = 4;
  return options;
}

// VISSL's arithmetic: ceil(samples / ranks), less the last partial batch with drop_last.
TEST(DeepClusterV2Memory, SizeIsTheImagesARankSeesInAnEpoch) {
  EXPECT_EQ(deepclusterv2_memory_size(1281167, 64, 64, true), 19968); // 20019 less 51
  EXPECT_EQ(deepclusterv2_memory_size(1281167, 64, 64, false), 20019);
  EXPECT_EQ(deepclusterv2_memory_size(13, 2, 3, true), 6);
  EXPECT_EQ(deepclusterv2_memory_size(13, 1, 3, false), 13);
}

TEST(DeepClusterV2Memory, WritesTheBanksCropsAndRepeatsTargetsPerCrop) {
  DeepClusterV2Memory memory(small_options());
  // Crop 0's rows are 1, crop 1's are 2 * (0, 0, 1): bank 0 keeps crop 1, normalised.
  const at::Tensor output =
      torch::cat({torch::ones({2, 3}), torch::tensor({{0.0f, 0.0f, 2.0f}}).expand({2, 3})});
  memory.write(output, torch::tensor({7, 3}, torch::kLong));
  EXPECT_EQ(memory.position(), 2);
  EXPECT_TRUE(memory.embeddings()[0].narrow(0, 0, 2).equal(
      torch::tensor({{0.0f, 0.0f, 1.0f}}).expand({2, 3})));
  EXPECT_TRUE(memory.sample_indexes().narrow(0, 0, 2).equal(torch::tensor({7, 3}, torch::kLong)));
  EXPECT_THROW(
      memory.write(torch::ones({6, 3}), torch::tensor({1, 2, 3}, torch::kLong)),
      Error); // 2 + 3 > 4
  EXPECT_THROW(
      memory.write(torch::ones({3, 3}), torch::tensor({1, 2}, torch::kLong)), Error); // not 2 crops
  const at::Tensor targets = memory.targets(torch::tensor({7, 3}, torch::kLong));
  EXPECT_EQ(targets.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(targets.eq(kDeepClusterV2Unassigned).all().item<bool>()); // not clustered yet
  memory.write(torch::ones({4, 3}), torch::tensor({0, 1}, torch::kLong));
  auto group = comm::ProcessGroup::single_process();
  memory.cluster(*group, at::make_generator<at::CPUGeneratorImpl>(0));
  EXPECT_EQ(memory.position(), 0);
  const at::Tensor clustered = memory.targets(torch::tensor({7, 3, 5}, torch::kLong));
  EXPECT_TRUE(clustered.narrow(1, 0, 3).equal(clustered.narrow(1, 3, 3))); // per crop
  EXPECT_EQ(clustered[0][2].item<int64_t>(), kDeepClusterV2Unassigned);    // in no bank
  EXPECT_GE(clustered[1][0].item<int64_t>(), 0);
}

TEST(DeepClusterV2Memory, RefusesMoreClustersThanRowsAndBadOptions) {
  DeepClusterV2MemoryOptions options = small_options();
  options.num_clusters = {5};
  DeepClusterV2Memory memory(options);
  auto group = comm::ProcessGroup::single_process();
  EXPECT_THROW(memory.cluster(*group, at::make_generator<at::CPUGeneratorImpl>(0)), Error);
  options.crops_for_mb = {2};
  EXPECT_THROW(DeepClusterV2Memory{options}, OptionError);
  options = small_options();
  options.num_clusters = {};
  EXPECT_THROW(DeepClusterV2Memory{options}, OptionError);
}

TEST(DeepClusterV2Memory, StateRoundTripsAndRefusesAnotherShape) {
  DeepClusterV2Memory memory(small_options());
  memory.write(torch::randn({4, 3}), torch::tensor({1, 2}, torch::kLong));
  memory.write(torch::randn({4, 3}), torch::tensor({4, 5}, torch::kLong));
  auto group = comm::ProcessGroup::single_process();
  memory.cluster(*group, at::make_generator<at::CPUGeneratorImpl>(1));
  memory.write(torch::randn({2, 3}), torch::tensor({9}, torch::kLong));
  DeepClusterV2Memory restored(small_options());
  restored.load_state_dict(memory.state_dict());
  EXPECT_EQ(restored.position(), 1);
  for (const auto& [name, value] : memory.state_dict()) {
    EXPECT_TRUE(value.equal(restored.state_dict().at(name))) << name;
  }
  DeepClusterV2MemoryOptions other = small_options();
  other.num_samples = 11;
  DeepClusterV2Memory wrong(other);
  EXPECT_THROW(wrong.load_state_dict(memory.state_dict()), CheckpointError);
}

} // namespace
} // namespace largo::models::deepclusterv2_test
