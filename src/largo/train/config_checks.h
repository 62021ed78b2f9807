// Private to the config layer: the checks its mappings share, each a config_error naming the
// key, the value and what is expected.
#pragma once

#include <fmt/format.h>

#include <largo/core/config.h>
#include <largo/core/error.h>

#include <cstdint>
#include <string>

namespace largo::train {

inline void
require(bool ok, const std::string& key, const std::string& value, const std::string& expected) {
  if (!ok) {
    throw config_error(key, value, expected);
  }
}

// An integer key that must be >= 0.
inline int64_t non_negative_int(const Config& config, const std::string& key) {
  const int64_t value = config.get_int(key);
  require(value >= 0, key, std::to_string(value), "an integer >= 0");
  return value;
}

// A number key that must be >= 0.
inline double non_negative(const Config& config, const std::string& key) {
  const double value = config.get_double(key);
  require(value >= 0.0, key, fmt::format("{}", value), "a number >= 0");
  return value;
}

// A number key that must be > 0.
inline double positive_number(const Config& config, const std::string& key) {
  const double value = config.get_double(key);
  require(value > 0, key, fmt::format("{}", value), "a number > 0");
  return value;
}

// An integer key that must be > 0.
inline int64_t positive_int(const Config& config, const std::string& key) {
  const int64_t value = config.get_int(key);
  require(value > 0, key, std::to_string(value), "an integer > 0");
  return value;
}

} // namespace largo::train
