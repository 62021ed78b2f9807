// Helpers shared by the model tests.
#pragma once

#include <largo/core/error.h>
#include <largo/models/model_factory.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>
#include <string>
#include <vector>

namespace largo::models::testing {

// The ConfigError message build_model throws for `options`, or "(no ConfigError)".
inline std::string error_of(const ModelOptions& options) {
  try {
    build_model(options);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(no ConfigError)";
}

// The case named `name` of tests/models/baselines/<file> (a {"cases": [{"name": ...}]} file
// written by tests/reference/<generator>); a test failure and null when absent.
inline nlohmann::json
baseline_case(const std::string& file, const std::string& generator, const std::string& name) {
  const std::string path = std::string(LARGO_TEST_DATA_DIR) + "/models/baselines/" + file;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path << "; regenerate it with $LARGO_PYTHON tests/reference/"
                  << generator;
    return {};
  }
  const nlohmann::json baselines = nlohmann::json::parse(in);
  for (const auto& entry : baselines.at("cases")) {
    if (entry.at("name") == name) {
      return entry;
    }
  }
  ADD_FAILURE() << "no case " << name << " in " << path;
  return {};
}

// A JSON list of rows as a float64 matrix.
inline at::Tensor json_matrix(const nlohmann::json& rows) {
  std::vector<double> values;
  int64_t width = 0;
  for (const auto& row : rows) {
    width = static_cast<int64_t>(row.size());
    for (const auto& value : row) {
      values.push_back(value.get<double>());
    }
  }
  return torch::tensor(values, torch::kFloat64).reshape({-1, width});
}

} // namespace largo::models::testing
