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

#include "test_paths.h"

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
  const std::string path = std::string(largo::test_paths::data_dir()) + "/models/baselines/" + file;
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

// A JSON list of numbers (a bias) or of rows (a weight) as a float32 tensor.
inline at::Tensor json_float_tensor(const nlohmann::json& value) {
  if (!value.empty() && value.front().is_array()) {
    return json_matrix(value).to(at::kFloat);
  }
  return torch::tensor(value.get<std::vector<double>>(), torch::kFloat64).to(at::kFloat);
}

inline double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// splitmix64, the generator tests/reference/gen_model_baselines.py uses with numpy uint64
// arithmetic.
inline uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// offset + scale * (2u - 1) with u = splitmix64(key * 2^32 + i) / 2^64, as float32: the
// closed-form tensors of gen_model_baselines.py (and the generators that reuse it).
inline at::Tensor closed_form(uint64_t key, at::IntArrayRef shape, double scale, double offset) {
  at::Tensor out = torch::empty(shape, torch::kFloat32);
  float* data = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const uint64_t bits = splitmix64((key << 32) + static_cast<uint64_t>(i)) >> 11;
    const double u = static_cast<double>(bits) * (1.0 / static_cast<double>(1ULL << 53));
    data[i] = static_cast<float>(offset + scale * (2.0 * u - 1.0));
  }
  return out;
}

} // namespace largo::models::testing
