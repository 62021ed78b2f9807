// Shared by the suites that compare whole training runs (ZeRO stages, FSDP): run a synthetic
// job on a given process group and compare two runs' losses and parameters.
#pragma once

#include <largo/checkpoint/checkpoint_file.h>
#include <largo/comm/process_group.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data/image_test_util.h"
#include "train/trainer_test_util.h"

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace largo::train {

using Overrides = std::vector<std::string>;

// 16 PNGs of 40x40 in two class folders a/ and b/ under the temp directory's `name`, made
// once (the self-supervised runs do not use their labels).
inline std::filesystem::path pattern_image_folder(const std::string& name) {
  const std::filesystem::path root = std::filesystem::temp_directory_path() / name;
  if (std::filesystem::exists(root / "b" / "7.png")) {
    return root;
  }
  for (int i = 0; i < 16; ++i) {
    const std::filesystem::path dir = root / (i < 8 ? "a" : "b");
    std::filesystem::create_directories(dir);
    data::testing::write_bytes(
        dir / (std::to_string(i % 8) + ".png"),
        data::testing::encode_png(data::testing::pattern_image(40, 40, i)));
  }
  return root;
}

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

// `resumed` continued from the checkpoint `reference` wrote after iteration `from`: its losses
// are `reference`'s from there on, and its final parameters `reference`'s, bit for bit.
inline void expect_resumed_bit_exactly(const RunResult& resumed, const RunResult& reference,
                                       size_t from, const std::string& what) {
  ASSERT_TRUE(resumed.summary.resumed) << what;
  ASSERT_EQ(from + resumed.summary.iteration_losses.size(),
            reference.summary.iteration_losses.size())
      << what;
  for (size_t i = 0; i < resumed.summary.iteration_losses.size(); ++i) {
    EXPECT_EQ(resumed.summary.iteration_losses[i], reference.summary.iteration_losses[from + i])
        << what << ": iteration " << from + i;
  }
  for (const auto& [name, value] : reference.parameters) {
    EXPECT_TRUE(torch::equal(resumed.parameters.at(name), value)) << what << ": " << name;
  }
}

// The mid-epoch resume check the ZeRO and FSDP suites share (collective): `job` (6
// iterations per epoch with a batch of 8 on the stateful sampler) runs uninterrupted into
// dir/full, and into dir/resumed with a checkpoint every 4 iterations, interrupted after 10;
// `inspect` sees dir/resumed then (its checkpoint files); the run resumed from iteration 8
// must equal the uninterrupted one bit for bit. Returns the uninterrupted run.
inline RunResult expect_mid_epoch_resume_bit_exact(
    const std::filesystem::path& dir, const Overrides& job, comm::ProcessGroup& group,
    const std::function<void(const std::filesystem::path& resumed_dir)>& inspect = {}) {
  if (group.rank() == 0) {
    std::filesystem::remove_all(dir);
  }
  group.barrier();
  const Overrides stateful = Overrides{"DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER=True",
                                       "DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"} +
      job;
  RunResult reference = train_run(dir / "full", stateful, borrow(group));
  const Overrides interrupted = stateful + Overrides{"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=4"};
  const std::filesystem::path run = dir / "resumed";
  EXPECT_TRUE(train_run(run, interrupted, borrow(group), 10).summary.interrupted);
  group.barrier();
  if (inspect) {
    inspect(run);
  }
  expect_resumed_bit_exactly(train_run(run, interrupted, borrow(group)), reference, 8,
                             "rank " + std::to_string(group.rank()));
  return reference;
}

// The optimizer entry of `consolidated` (a consolidated sharded checkpoint) holds the same
// type and momentum buffers as `plain`'s (an unsharded run's), within `tolerance`.
inline void expect_same_momentum(const std::filesystem::path& consolidated,
                                 const std::filesystem::path& plain, double tolerance) {
  auto merged = checkpoint::load_checkpoint(consolidated).at("optimizer").toGenericDict();
  auto expected = checkpoint::load_checkpoint(plain).at("optimizer").toGenericDict();
  EXPECT_EQ(merged.at("type").toStringRef(), expected.at("type").toStringRef());
  const auto expected_state = expected.at("state").toGenericDict();
  ASSERT_EQ(merged.at("state").toGenericDict().size(), expected_state.size());
  for (const auto& item : merged.at("state").toGenericDict()) {
    const at::Tensor momentum = item.value().toGenericDict().at("momentum_buffer").toTensor();
    const at::Tensor expected_momentum =
        expected_state.at(item.key()).toGenericDict().at("momentum_buffer").toTensor();
    EXPECT_TRUE(torch::allclose(momentum, expected_momentum, tolerance, tolerance))
        << item.key().toStringRef();
  }
}

inline void copy_run(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to,
                        std::filesystem::copy_options::recursive |
                            std::filesystem::copy_options::copy_symlinks);
}

} // namespace largo::train
