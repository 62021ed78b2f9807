// Shared by the pipeline tests: a small trunk-of-blocks model, its data stream, and the
// single-process reference each rank trains locally to compare its stages with.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/models/mlp.h>
#include <largo/models/trunk_head_model.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>

#include "parallel/parallelize_test_util.h" // borrow

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace largo::parallel::testing {

constexpr int64_t kClasses = 4;

// 8 blocks: 7 MLP trunk blocks ([b, 1, 4, 4] -> 12 -> ... -> 12) and a Linear head.
inline models::TrunkHeadModel make_model(uint64_t seed = 3) {
  torch::manual_seed(seed);
  models::MlpOptions mlp;
  mlp.hidden_dims = {12, 12, 12, 12, 12, 12, 12};
  auto trunk = models::build_mlp_trunk(mlp, /*in_channels=*/1, /*image_size=*/4);
  const int64_t width = trunk.output_dim;
  return models::TrunkHeadModel(
      std::move(trunk), torch::nn::Sequential(torch::nn::Linear(width, kClasses)));
}

// Batch `step` of the global stream: images [batch, 1, 4, 4], labels [batch].
inline std::pair<at::Tensor, at::Tensor> global_batch(int step, int64_t batch) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  return {at::randn({batch, 1, 4, 4}, generator), at::randint(0, kClasses, {batch}, generator)};
}

// Rows [replica * n, (replica + 1) * n) of a batch split over `replicas`.
inline at::Tensor replica_slice(const at::Tensor& batch, int replica, int replicas) {
  const int64_t n = batch.size(0) / replicas;
  return batch.narrow(0, replica * n, n);
}

inline at::Tensor cross_entropy(const at::Tensor& output, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(output, target);
}

inline std::unique_ptr<optim::SGD> make_sgd(const torch::nn::Module& module) {
  optim::ParamGroupOptions groups;
  groups.lr = 0.1;
  groups.weight_decay = 1e-3;
  optim::SGDOptions sgd;
  sgd.momentum = 0.9;
  return std::make_unique<optim::SGD>(optim::build_param_groups(module, groups), sgd);
}

// The reference: `steps` SGD steps on the whole global batch in this process. Returns the
// per-step losses; `model` holds the trained weights.
inline std::vector<double>
train_reference(models::TrunkHeadModel& model, int steps, int64_t batch) {
  auto sgd = make_sgd(*model);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    auto [images, labels] = global_batch(step, batch);
    sgd->zero_grad();
    at::Tensor loss = cross_entropy(model->forward(images), labels);
    loss.backward();
    sgd->step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// The same steps through a pipeline, this replica's part of each global batch, with the
// optimizer `make_optimizer` builds over this rank's stages (make_sgd by default).
inline std::vector<double> train_pipeline(
    PipelineParallel& pipeline,
    int steps,
    int64_t batch,
    int replica = 0,
    int replicas = 1,
    const std::function<std::unique_ptr<optim::Optimizer>(const torch::nn::Module&)>&
        make_optimizer = {}) {
  auto sgd = make_optimizer ? make_optimizer(*pipeline.module()) : make_sgd(*pipeline.module());
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    auto [images, labels] = global_batch(step, batch);
    sgd->zero_grad();
    losses.push_back(pipeline.forward_backward(
        replica_slice(images, replica, replicas),
        replica_slice(labels, replica, replicas),
        cross_entropy));
    pipeline.reduce_gradients();
    sgd->step();
  }
  return losses;
}

// The largest difference between this rank's stages and the same-named tensors of `model`.
inline double max_difference(const PipelineParallel& pipeline, const torch::nn::Module& model) {
  double most = 0.0;
  const auto reference = model.named_parameters();
  for (const auto& entry : pipeline.state_dict()) {
    const auto* expected = reference.find(entry.key().toStringRef());
    EXPECT_NE(expected, nullptr) << entry.key().toStringRef();
    if (expected) {
      const at::Tensor diff = entry.value().toTensor() - *expected;
      most = std::max(most, diff.abs().max().item<double>());
    }
  }
  return most;
}

// The gradients of the reference model on the whole batch of step 0, by parameter name.
inline std::map<std::string, at::Tensor> reference_gradients(int64_t batch) {
  auto model = make_model();
  auto [images, labels] = global_batch(0, batch);
  cross_entropy(model->forward(images), labels).backward();
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : model->named_parameters()) {
    grads[item.key()] = item.value().grad().clone();
  }
  return grads;
}

// The largest difference between this rank's gradients and the reference's, each divided
// by the largest magnitude in the reference tensor (so that layers with tiny gradients
// count as much as the others).
inline double max_relative_gradient_difference(
    const PipelineParallel& pipeline, const std::map<std::string, at::Tensor>& expected) {
  double most = 0.0;
  for (const auto& item : pipeline.module()->named_parameters()) {
    const at::Tensor& reference = expected.at(item.key());
    const at::Tensor grad = item.value().grad();
    EXPECT_TRUE(grad.defined()) << item.key();
    if (grad.defined()) {
      const double scale = reference.abs().max().item<double>();
      most = std::max(most, (grad - reference).abs().max().item<double>() / scale);
    }
  }
  return most;
}

} // namespace largo::parallel::testing
