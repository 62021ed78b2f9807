// The run directory at start: resume from checkpoint.torch or the newest intact checkpoint
// (with a warning naming both), refuse when none is intact, never overwrite checkpoints from a
// fresh start, and clean temporaries of killed writes.
#include <largo/core/error.h>
#include <largo/train/resume_policy.h>

#include "checkpoint/checkpoint_test_util.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace largo::train::resume_policy_test {
namespace {

namespace fs = std::filesystem;

// What the trainer writes, in miniature.
checkpoint::StateDict training_state(int64_t epoch) {
  checkpoint::StateDict state = checkpoint::make_state_dict();
  checkpoint::StateDict model(c10::StringType::get(), c10::TensorType::get());
  model.insert("fc.weight", torch::full({4, 4}, static_cast<float>(epoch)));
  state.insert("model", model);
  checkpoint::StateDict optimizer = checkpoint::make_state_dict();
  optimizer.insert("type", std::string("sgd"));
  state.insert("optimizer", optimizer);
  state.insert("epoch", epoch);
  state.insert("iteration_in_epoch", int64_t{0});
  state.insert("iteration", epoch * 10);
  state.insert("iterations_per_epoch", int64_t{10});
  state.insert("complete", false);
  state.insert("rng_state", torch::zeros({16}, torch::kUInt8));
  state.insert("top1", c10::IValue());
  return state;
}

class RunDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format(
               "largo_rundir_{}_{}",
               ::getpid(),
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }

  // model_phase<epoch>.torch, written `age_seconds` ago; checkpoint.torch points at it.
  fs::path write(int64_t epoch, int age_seconds) {
    const std::string name = fmt::format("model_phase{}.torch", epoch);
    checkpoint::save_checkpoint(dir_ / name, training_state(epoch));
    fs::last_write_time(
        dir_ / name, fs::file_time_type::clock::now() - std::chrono::seconds(age_seconds));
    fs::remove(dir_ / checkpoint::kLatestCheckpointName);
    fs::create_symlink(name, dir_ / checkpoint::kLatestCheckpointName);
    return dir_ / name;
  }

  void flip_a_tensor_bit(const fs::path& path) {
    testing::flip_bits_in_entry(path, "archive/data/0", 3, 1);
  }

  fs::path dir_;
};

TEST_F(RunDirectoryTest, FirstRunHasNothingToResume) {
  EXPECT_FALSE(choose_resume_checkpoint(dir_).has_value());
  EXPECT_FALSE(prepare_fresh_start(dir_, /*overwrite_existing=*/false).has_value());
}

TEST_F(RunDirectoryTest, AnIntactLinkIsResumedWithoutWarning) {
  write(0, 20);
  const fs::path newest = write(1, 10);
  auto choice = choose_resume_checkpoint(dir_);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->path, fs::canonical(newest));
  EXPECT_EQ(choice->warning, "");
  EXPECT_EQ(choice->state.at("epoch").toInt(), 1);
}

TEST_F(RunDirectoryTest, ABadLinkFallsBackToTheNewestIntactCheckpointNamingBoth) {
  const fs::path old = write(0, 30);
  const fs::path middle = write(1, 20);
  const fs::path newest = write(2, 10);
  flip_a_tensor_bit(newest); // checkpoint.torch -> model_phase2.torch, damaged
  auto choice = choose_resume_checkpoint(dir_);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->path, middle);
  EXPECT_NE(choice->warning.find(newest.string()), std::string::npos) << choice->warning;
  EXPECT_NE(choice->warning.find("CRC-32"), std::string::npos) << choice->warning;
  EXPECT_NE(choice->warning.find("resuming from " + middle.string()), std::string::npos)
      << choice->warning;

  fs::remove(dir_ / checkpoint::kLatestCheckpointName); // missing: the newest intact file
  choice = choose_resume_checkpoint(dir_);
  EXPECT_EQ(choice->path, middle);
  EXPECT_NE(choice->warning.find("checkpoint.torch is missing"), std::string::npos);

  fs::create_symlink("model_phase9.torch", dir_ / checkpoint::kLatestCheckpointName); // dangling
  EXPECT_NE(
      choose_resume_checkpoint(dir_)->warning.find("which does not exist"), std::string::npos);
  (void)old;
}

TEST_F(RunDirectoryTest, ADirectoryNamedCheckpointTorchIsRefusedUpFront) {
  // Training would otherwise fail at its first checkpoint, an epoch later.
  fs::create_directories(dir_ / checkpoint::kLatestCheckpointName);
  EXPECT_THROW(choose_resume_checkpoint(dir_), CheckpointError);
  try {
    prepare_fresh_start(dir_, /*overwrite_existing=*/true);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.torch is a directory"), std::string::npos);
  }
}

TEST_F(RunDirectoryTest, NoIntactCheckpointIsRefusedListingEachFile) {
  const fs::path a = write(0, 20);
  const fs::path b = write(1, 10);
  flip_a_tensor_bit(a);
  fs::resize_file(b, fs::file_size(b) / 2);
  try {
    choose_resume_checkpoint(dir_);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("none is intact"), std::string::npos) << message;
    EXPECT_NE(message.find(a.string()), std::string::npos) << message;
    EXPECT_NE(message.find(b.string()), std::string::npos) << message;
  }
}

TEST_F(RunDirectoryTest, ForeignCheckpointsAreNotIntact) {
  // A "model" entry that is a tensor: refused by name, not by an INTERNAL ASSERT later.
  checkpoint::StateDict state = training_state(0);
  state.insert_or_assign("model", torch::ones({3}));
  checkpoint::save_checkpoint(dir_ / "model_phase0.torch", state);
  try {
    load_intact_checkpoint(dir_ / "model_phase0.torch");
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(
        std::string(e.what()).find("model_phase0.torch is not a Largo training checkpoint: "
                                   "its entry 'model' is a Tensor"),
        std::string::npos)
        << e.what();
  }
  // A ZeRO checkpoint whose shard is missing.
  state = training_state(0);
  checkpoint::StateDict optimizer = checkpoint::make_state_dict();
  optimizer.insert("type", std::string("zero_sharded"));
  optimizer.insert("world_size", int64_t{1});
  optimizer.insert("shard_files", c10::List<std::string>({"model_phase0_shard0.torch"}));
  state.insert_or_assign("optimizer", optimizer);
  checkpoint::save_checkpoint(dir_ / "model_phase0.torch", state);
  EXPECT_THROW(load_intact_checkpoint(dir_ / "model_phase0.torch"), CheckpointError);
}

TEST_F(RunDirectoryTest, AFreshStartNeverOverwritesCheckpoints) {
  write(0, 10);
  std::ofstream(dir_ / "metrics.jsonl") << "{}\n";
  try {
    prepare_fresh_start(dir_, /*overwrite_existing=*/false);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("would overwrite them"), std::string::npos) << message;
    EXPECT_NE(message.find("CHECKPOINT.OVERWRITE_EXISTING=True"), std::string::npos) << message;
  }
  EXPECT_TRUE(fs::exists(dir_ / "model_phase0.torch"));
  const auto aside = prepare_fresh_start(dir_, /*overwrite_existing=*/true);
  ASSERT_TRUE(aside.has_value());
  EXPECT_TRUE(fs::exists(*aside / "model_phase0.torch"));
  EXPECT_TRUE(fs::exists(*aside / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ / checkpoint::kLatestCheckpointName)));
  EXPECT_TRUE(checkpoint_files(dir_).empty());
}

TEST_F(RunDirectoryTest, TheBestModelIsNeverResumedButIsNeverOverwritten) {
  // model_best.torch holds weights only: newer than every checkpoint, it must not be taken
  // for one when checkpoint.torch is missing.
  const fs::path phase0 = write(0, 20);
  checkpoint::StateDict best = checkpoint::make_state_dict();
  best.insert("model", training_state(0).at("model"));
  checkpoint::save_checkpoint(dir_ / checkpoint::kBestModelName, best);
  EXPECT_EQ(checkpoint_files(dir_), std::vector<fs::path>{phase0});
  fs::remove(dir_ / checkpoint::kLatestCheckpointName);
  auto choice = choose_resume_checkpoint(dir_);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->path, phase0);
  EXPECT_EQ(choice->warning.find(checkpoint::kBestModelName), std::string::npos) << choice->warning;

  // Alone in the directory, it is still history a fresh start must not overwrite.
  fs::remove(phase0);
  EXPECT_FALSE(choose_resume_checkpoint(dir_).has_value());
  EXPECT_THROW(prepare_fresh_start(dir_, /*overwrite_existing=*/false), CheckpointError);
  const auto aside = prepare_fresh_start(dir_, /*overwrite_existing=*/true);
  ASSERT_TRUE(aside.has_value());
  EXPECT_TRUE(fs::exists(*aside / checkpoint::kBestModelName));
}

TEST_F(RunDirectoryTest, TemporariesOfDeadWritersAreRemoved) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::_exit(0);
  }
  ::waitpid(child, nullptr, 0); // now no process has that pid
  const fs::path dead = dir_ / fmt::format("model_phase0.torch.tmp.{}", child);
  const fs::path alive = dir_ / fmt::format("model_phase1.torch.tmp.{}", ::getpid());
  for (const fs::path& path :
       {dead, alive, dir_ / "checkpoint.torch.tmp", dir_ / "notes.tmp.txt"}) {
    std::ofstream(path) << "partial";
  }
  const auto removed = remove_stale_temporaries(dir_);
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(dir_ / "checkpoint.torch.tmp"));
  EXPECT_TRUE(fs::exists(alive));
  EXPECT_TRUE(fs::exists(dir_ / "notes.tmp.txt"));
}

} // namespace
} // namespace largo::train::resume_policy_test
