// COPY_TO_LOCAL_DISK over ranks: the first rank of each machine copies, every rank reads the
// copy, and a failed copy stops every rank with the reason on the rank that failed.
#include <largo/train/local_data_copy.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>

#include <fstream>

#include "comm/distributed_test_util.h"
#include "trainer_test_util.h"

namespace largo::train::local_data_copy_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

TrainerOptions folder_run(const fs::path& images, const fs::path& local_dir) {
  TrainerOptions options;
  options.train.source.source = "disk_folder";
  options.train.source.path = images;
  options.train.source.local_copy_dir = local_dir;
  options.test_model = false;
  return options;
}

// Two ranks of one machine (procs_per_node 2): rank 0 copies, both read the copy. The ranks
// are processes of their own, so the data and the copy live in a directory named after the
// test, which the parent prepares.
TEST(LocalDataCopy, FirstRankOfAMachineCopiesAndEveryRankReadsTheCopy) {
  const fs::path dir = test_dir_for("local_data_copy");
  const fs::path images = dir / "shared" / "train";
  const fs::path local = dir / "local";
  if (largo::testing::is_parent()) {
    fs::remove_all(dir);
    fs::create_directories(images / "cat");
    std::ofstream(images / "cat" / "1.png") << "x";
  }
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    const TrainerOptions copied =
        with_local_data_copies(folder_run(images, local), group, /*procs_per_node=*/2);
    EXPECT_EQ(copied.train.source.path, local / "train");
    EXPECT_TRUE(fs::is_regular_file(local / "train" / "copy_complete")); // whole for every rank
    EXPECT_TRUE(fs::is_regular_file(local / "train" / "cat" / "1.png"));
  });
  if (largo::testing::is_parent()) {
    fs::remove_all(dir);
  }
}

TEST(LocalDataCopy, AFailedCopyStopsEveryRank) {
  const fs::path dir = test_dir_for("local_data_copy");
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    try {
      with_local_data_copies(folder_run(dir / "missing", dir / "local"), group, 2);
      ADD_FAILURE() << "rank " << group.rank() << " went on";
    } catch (const DataError& error) {
      const std::string message = error.what();
      const std::string expected =
          group.rank() == 0 ? "DATA.TRAIN.COPY_TO_LOCAL_DISK" : "failed on another rank";
      EXPECT_NE(message.find(expected), std::string::npos) << message;
    }
  });
}

} // namespace
} // namespace largo::train::local_data_copy_test
