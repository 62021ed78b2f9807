// Shared by the suites that compare whole training runs (ZeRO stages, FSDP): run a synthetic
// job on a given process group and compare two runs' losses and parameters.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "train/trainer_test_util.h"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace largo::train {

using Overrides = std::vector<std::string>;

inline Overrides operator+(Overrides a, const Overrides& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A shared_ptr to a group the test harness owns.
inline std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

struct RunResult {
  TrainSummary summary;
  std::map<std::string, at::Tensor> parameters;
};

// Trains synthetic_job_config(dir, overrides) on `group` (collective); stop_after >= 0
// interrupts the run after that many iterations, as if killed.
inline RunResult train_run(const std::filesystem::path& dir, const Overrides& overrides,
                           std::shared_ptr<comm::ProcessGroup> group, int64_t stop_after = -1) {
  auto options = trainer_options_from_config(synthetic_job_config(dir, overrides));
  options.stop_after_iterations = stop_after;
  Trainer trainer(options, "", std::move(group));
  TrainSummary summary = trainer.run();
  return RunResult{std::move(summary), trainer.full_parameters()};
}

// The same losses and parameters within `tolerance` (absolute and relative).
inline void expect_same_training(const RunResult& actual, const RunResult& expected,
                                 double tolerance, const std::string& what) {
  ASSERT_EQ(actual.summary.iteration_losses.size(), expected.summary.iteration_losses.size())
      << what;
  for (size_t i = 0; i < actual.summary.iteration_losses.size(); ++i) {
    EXPECT_NEAR(actual.summary.iteration_losses[i], expected.summary.iteration_losses[i],
                tolerance)
        << what << ": iteration " << i;
  }
  ASSERT_EQ(actual.parameters.size(), expected.parameters.size()) << what;
  for (const auto& [name, value] : expected.parameters) {
    EXPECT_TRUE(torch::allclose(actual.parameters.at(name), value, tolerance, tolerance))
        << what << ": parameter " << name << " differs by "
        << (actual.parameters.at(name) - value).abs().max().item<double>();
  }
}

inline void copy_run(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to,
                        std::filesystem::copy_options::recursive |
                            std::filesystem::copy_options::copy_symlinks);
}

} // namespace largo::train
