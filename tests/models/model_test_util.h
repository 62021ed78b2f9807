// Helpers shared by the model tests.
#pragma once

#include <largo/core/error.h>
#include <largo/models/model_factory.h>

#include <string>

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

} // namespace largo::models::testing
