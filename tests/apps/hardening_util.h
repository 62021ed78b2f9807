// A tiny job and the checks shared by the issue-19 tests that run the `largo` program
// (hardening_test.cpp, hardening_wiring_test.cpp).
#pragma once

#include "apps/program_runner.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace largo::testing {

// An MLP on synthetic 1x8x8 images, 4 classes, `epochs` epochs, run directory dir/run;
// `extra` lines go under `config:`.
inline std::filesystem::path
write_job(const TestDir& dir, int epochs, const std::string& extra = "") {
  const std::filesystem::path config = dir / "job.yaml";
  std::ofstream(config) << fmt::format(
      R"(config:
  DATA:
    NUM_DATALOADER_WORKERS: 1
    TRAIN:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {{NUM_SAMPLES: 64, IMAGE_SHAPE: [1, 8, 8], NUM_CLASSES: 4}}
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS: [{{name: ToTensor}}]
    TEST:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {{NUM_SAMPLES: 16, IMAGE_SHAPE: [1, 8, 8], NUM_CLASSES: 4}}
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS: [{{name: ToTensor}}]
  MODEL:
    TRUNK: {{NAME: mlp, MLP: {{HIDDEN_DIMS: [16]}}}}
  OPTIMIZER:
    name: sgd
    num_epochs: {}
    param_schedulers:
      lr: {{name: constant, value: 0.01}}
  MACHINE: {{DEVICE: cpu, NUM_THREADS: 1}}
  DISTRIBUTED: {{BACKEND: gloo, COLLECTIVE_TIMEOUT_SECONDS: 60}}
  CHECKPOINT: {{DIR: "{}"}}
{})",
      epochs,
      (dir / "run").string(),
      extra);
  return config;
}

inline bool output_contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The run ended with `code`, quickly, with `expected` in its message and no stack frames.
inline void expect_clean_failure(
    const ProgramResult& run, int code, const std::string& expected, double max_seconds = 30.0) {
  EXPECT_TRUE(run.exited_with(code)) << run.status() << "\n" << run.output;
  EXPECT_LT(run.seconds, max_seconds) << run.output;
  EXPECT_TRUE(output_contains(run.output, expected)) << "expected '" << expected << "' in:\n"
                                                     << run.output;
  EXPECT_FALSE(output_contains(run.output, "frame #")) << run.output;
  EXPECT_FALSE(output_contains(run.output, "Exception raised from")) << run.output;
}

} // namespace largo::testing
