// Shared by the optim tests: the closed-form parameters and gradients that
// tests/reference/gen_optim_baselines.py also uses, and a loader for its JSON output.
#pragma once

#include <largo/core/error.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace largo::optim::testing {

inline at::Tensor tensor_from(const std::vector<double>& values, at::IntArrayRef shape) {
  return torch::tensor(values, torch::kFloat64).reshape(shape);
}

// Parameter k, flat element i: 0.5 * cos(0.37 * i + k).
inline at::Tensor initial_param(int64_t k, at::IntArrayRef shape) {
  std::vector<double> values(static_cast<size_t>(c10::multiply_integers(shape)));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = 0.5 * std::cos(0.37 * static_cast<double>(i) + static_cast<double>(k));
  }
  return tensor_from(values, shape);
}

// sin(0.1 * step + 0.01 * i + 0.5 * k), elementwise with libm as Python's math.sin does.
inline at::Tensor sin_term(int64_t step, int64_t k, at::IntArrayRef shape) {
  std::vector<double> values(static_cast<size_t>(c10::multiply_integers(shape)));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(
        0.1 * static_cast<double>(step) + 0.01 * static_cast<double>(i) +
        0.5 * static_cast<double>(k));
  }
  return tensor_from(values, shape);
}

// The gradient of step `step` (1-based): p * 0.05 + sin_term, the same tensor ops as Python.
inline void set_grads(std::vector<at::Tensor>& params, int64_t step) {
  for (size_t k = 0; k < params.size(); ++k) {
    params[k].mutable_grad() =
        params[k].detach() * 0.05 + sin_term(step, static_cast<int64_t>(k), params[k].sizes());
  }
}

inline std::vector<at::Tensor> make_params(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<at::Tensor> params;
  for (size_t k = 0; k < shapes.size(); ++k) {
    params.push_back(initial_param(static_cast<int64_t>(k), shapes[k]).requires_grad_());
  }
  return params;
}

// tests/optim/baselines/<file>, written by tests/reference/<generator>.
inline nlohmann::json load_baselines(
    const std::string& file = "optim_baselines.json",
    const std::string& generator = "gen_optim_baselines.py") {
  const std::string path = std::string(largo::test_paths::data_dir()) + "/optim/baselines/" + file;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path << "; regenerate it with $LARGO_PYTHON tests/reference/"
                  << generator;
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(in);
}

// |actual - expected| <= rel * max(1, |expected|): relative for large values, absolute near 0.
inline bool close(double actual, double expected, double rel) {
  return std::abs(actual - expected) <= rel * std::max(1.0, std::abs(expected));
}

// Runs `fn`, which must throw ConfigError, and checks its message contains every part.
template <typename Fn>
void expect_config_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << error.what();
    }
  }
}

} // namespace largo::optim::testing
