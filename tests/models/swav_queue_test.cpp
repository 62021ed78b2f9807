// SwAV's queue against a transcription of VISSL's (tests/reference/
// gen_swav_queue_baselines.py): the same initial draw, the same losses over 7 iterations
// that start using the queue at iteration 2 (rescoring, appending, pushing, with a gradient
// step and the prototypes' normalisation between iterations), the same queue at the end; and
// its state saved and loaded back.
#include <largo/comm/process_group.h>
#include <largo/core/error.h>
#include <largo/models/swav_loss.h>
#include <largo/models/swav_queue.h>

#include "model_test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::models::swav_queue_test {
namespace {

using testing::baseline_case;
using testing::json_matrix;

at::Tensor flat(const nlohmann::json& values, at::IntArrayRef shape) {
  return torch::tensor(values.get<std::vector<double>>(), torch::kFloat32).reshape(shape);
}

SwavQueueOptions queue_options(const nlohmann::json& o) {
  SwavQueueOptions options;
  options.length = o.at("queue_length").get<int64_t>();
  options.start_iter = o.at("start_iter").get<int64_t>();
  options.embedding_dim = o.at("embedding_dim").get<int64_t>();
  options.num_prototypes = o.at("num_prototypes").get<std::vector<int64_t>>();
  options.num_crops = o.at("num_crops").get<int64_t>();
  options.crops_for_assign = o.at("crops_for_assign").get<std::vector<int64_t>>();
  return options;
}

SwavLossOptions loss_options(const nlohmann::json& o) {
  SwavLossOptions options;
  options.temperature = o.at("temperature").get<double>();
  options.epsilon = o.at("epsilon").get<double>();
  options.num_iters = o.at("num_iters").get<int64_t>();
  options.num_crops = o.at("num_crops").get<int64_t>();
  options.crops_for_assign = o.at("crops_for_assign").get<std::vector<int64_t>>();
  return options;
}

// The queue's state against the reference's {"scores": [...], "embeddings": [...]} within
// `tolerance` of the values' scale (0: bit for bit).
void expect_state(const SwavQueue& queue, const nlohmann::json& expected, double tolerance) {
  const auto state = queue.state_dict();
  const auto& scores = expected.at("scores");
  for (size_t j = 0; j < scores.size(); ++j) {
    const at::Tensor& actual = state.at("local_queue" + std::to_string(j));
    const at::Tensor reference = flat(scores[j], actual.sizes());
    EXPECT_LE((actual - reference).abs().max().item<double>(), tolerance * 2) << "scores " << j;
  }
  const at::Tensor& actual = state.at("local_emb_queue");
  EXPECT_LE(
      (actual - flat(expected.at("embeddings"), actual.sizes())).abs().max().item<double>(),
      tolerance)
      << "embeddings";
}

TEST(SwavQueueTest, MatchesVisslsQueueOverIterations) {
  const nlohmann::json entry = baseline_case(
      "swav_queue_baselines.json", "gen_swav_queue_baselines.py", "two_sets_three_crops");
  ASSERT_FALSE(entry.is_null());
  const nlohmann::json& o = entry.at("options");
  SwavHeadOptions head_options;
  head_options.dims = {5, o.at("embedding_dim").get<int64_t>()};
  head_options.num_clusters = o.at("num_prototypes").get<std::vector<int64_t>>();
  SwavHead head(head_options);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : head->named_parameters()) {
      item.value().copy_(flat(entry.at("parameters").at(item.key()), item.value().sizes()));
    }
  }
  SwavQueue queue(
      queue_options(o),
      at::make_generator<at::CPUGeneratorImpl>(entry.at("queue_seed").get<uint64_t>()));
  expect_state(queue, entry.at("queue_start"), 0.0); // the same draws, bit for bit

  auto group = comm::ProcessGroup::single_process();
  const double lr = entry.at("lr").get<double>();
  const auto& losses = entry.at("losses");
  for (int64_t t = 0; t < static_cast<int64_t>(losses.size()); ++t) {
    const std::vector<at::Tensor> out =
        head->forward(json_matrix(entry.at("features")[t]).to(torch::kFloat32));
    if (queue.in_use(t - 1)) {
      queue.rescore(*head);
    }
    at::Tensor loss = torch::zeros({});
    for (size_t j = 0; j + 1 < out.size(); ++j) {
      loss = loss + swav_loss(
                        out[j + 1],
                        *group,
                        loss_options(o),
                        queue.in_use(t) ? queue.scores(j) : std::vector<at::Tensor>{});
    }
    loss = loss / static_cast<double>(out.size() - 1);
    if (queue.in_use(t)) {
      queue.push(out[0]);
    }
    // float32 throughout; Sinkhorn's exp(scores / 0.05) turns a score's rounding (~1e-7) into
    // ~2e-6 of an assignment, and 7 coupled gradient steps carry it on: 1e-4 of the loss.
    const double expected = losses[t].get<double>();
    EXPECT_NEAR(loss.item<double>(), expected, 1e-4 * std::max(1.0, std::abs(expected)))
        << "iteration " << t;
    head->zero_grad();
    loss.backward();
    {
      torch::NoGradGuard no_grad;
      for (auto& parameter : head->parameters()) {
        parameter.sub_(lr * parameter.grad());
      }
    }
    head->normalize_prototypes();
  }
  expect_state(queue, entry.at("queue_end"), 1e-4);
}

TEST(SwavQueueTest, StateSavesAndLoadsAndRefusesAnotherShape) {
  SwavQueueOptions options;
  options.length = 6;
  options.embedding_dim = 4;
  options.num_prototypes = {3};
  SwavQueue saved(options, at::make_generator<at::CPUGeneratorImpl>(1));
  saved.push(torch::randn({4, 4})); // 2 crops x 2 images
  SwavQueue loaded(options, at::make_generator<at::CPUGeneratorImpl>(2));
  loaded.load_state_dict(saved.state_dict());
  for (const auto& [name, tensor] : saved.state_dict()) {
    EXPECT_TRUE(torch::equal(loaded.state_dict().at(name), tensor)) << name;
  }
  options.length = 8;
  SwavQueue longer(options, at::make_generator<at::CPUGeneratorImpl>(3));
  try {
    longer.load_state_dict(saved.state_dict());
    ADD_FAILURE() << "a queue of another length was loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("local_queue0 has shape [2, 6, 3]"), std::string::npos)
        << e.what();
  }
  options.length = 0;
  EXPECT_THROW(SwavQueue(options, at::make_generator<at::CPUGeneratorImpl>(4)), OptionError);
}

} // namespace
} // namespace largo::models::swav_queue_test
