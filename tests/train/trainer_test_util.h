// Shared by the trainer suites: a small, fast synthetic job and the metrics reader.
#pragma once

#include <largo/core/config.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace largo::train {

// A synthetic job of 3 epochs x 6 iterations (96 samples, batch 16). The small CNN's dropout
// draws from the global generator, so resume is only bit-exact if the checkpoint restores
// the RNG state.
inline Config synthetic_job_config(const std::filesystem::path& run_dir,
                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {
      "DATA.TRAIN.DATA_SOURCES=[synthetic]", "DATA.TEST.DATA_SOURCES=[synthetic]",
      "DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=96", "DATA.TEST.SYNTHETIC.NUM_SAMPLES=32",
      "DATA.TRAIN.SYNTHETIC.IMAGE_SHAPE=[1,24,24]", "DATA.TEST.SYNTHETIC.IMAGE_SHAPE=[1,24,24]",
      "DATA.TRAIN.BATCHSIZE_PER_REPLICA=16", "DATA.TEST.BATCHSIZE_PER_REPLICA=16",
      "DATA.TRAIN.TRANSFORMS=[{name: RandomHorizontalFlip}, {name: ToTensor}]",
      "DATA.TEST.TRANSFORMS=[{name: ToTensor}]", "DATA.NUM_DATALOADER_WORKERS=2",
      "MODEL.TRUNK.NAME=small_cnn", "MODEL.TRUNK.SMALL_CNN.DROPOUT=0.5",
      "OPTIMIZER.num_epochs=3", "OPTIMIZER.param_schedulers.lr.name=cosine",
      "OPTIMIZER.param_schedulers.lr.start_value=0.1",
      "OPTIMIZER.param_schedulers.lr.update_interval=step", "MACHINE.DEVICE=cpu",
      "MACHINE.NUM_THREADS=1", "LOG_FREQUENCY=4", "CHECKPOINT.DIR=" + run_dir.string()};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return Config::load({}, overrides);
}

// A directory under /tmp named after `suite` and the running test.
inline std::filesystem::path test_dir_for(const std::string& suite) {
  return std::filesystem::temp_directory_path() /
         ("largo_trainer_" + suite + "_" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path) {
  std::vector<nlohmann::json> events;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    events.push_back(nlohmann::json::parse(line));
  }
  return events;
}

} // namespace largo::train
