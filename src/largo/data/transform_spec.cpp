// Checked reading of a transform spec's arguments.
#include "largo/data/transform_spec.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "largo/core/error.h"

namespace largo::data {

TransformArgs::TransformArgs(const TransformSpec& spec, const std::set<std::string>& allowed)
    : spec_(&spec) {
  auto check = [&](const std::string& key) {
    if (allowed.count(key) == 0) {
      throw ConfigError(fmt::format(
          "transform {}: unknown argument '{}'; it takes: {}",
          spec.name,
          key,
          allowed.empty() ? std::string("no arguments") : fmt::format("{}", allowed)));
    }
  };
  for (const auto& [key, value] : spec.args) {
    check(key);
  }
  for (const auto& [key, value] : spec.text_args) {
    check(key);
  }
  for (const auto& [key, value] : spec.nested_args) {
    check(key);
  }
  for (const auto& [key, value] : spec.transform_args) {
    check(key);
  }
}

void TransformArgs::fail(const std::string& key, const std::string& message) const {
  throw ConfigError(fmt::format("transform {}: '{}' {}", spec_->name, key, message));
}

bool TransformArgs::has(const std::string& key) const {
  return spec_->args.count(key) != 0 || spec_->text_args.count(key) != 0 ||
         spec_->nested_args.count(key) != 0 || spec_->transform_args.count(key) != 0;
}

const std::vector<std::vector<double>>&
TransformArgs::nested_numbers(const std::string& key) const {
  const auto it = spec_->nested_args.find(key);
  if (it == spec_->nested_args.end()) {
    fail(
        key,
        has(key) ? "must be a list of lists of numbers, e.g. [[0.14, 1.0], [0.05, 0.14]]"
                 : "is required but missing");
  }
  return it->second;
}

const std::vector<TransformSpec>& TransformArgs::transforms(const std::string& key) const {
  const auto it = spec_->transform_args.find(key);
  if (it == spec_->transform_args.end()) {
    fail(
        key,
        has(key) ? "must be a list of transforms ({name: ..., ...} maps)"
                 : "is required but missing");
  }
  return it->second;
}

const std::vector<double>& TransformArgs::numbers(const std::string& key) const {
  const auto it = spec_->args.find(key);
  if (it == spec_->args.end()) {
    if (spec_->nested_args.count(key) != 0 || spec_->transform_args.count(key) != 0) {
      fail(key, "must be a number or a flat list of numbers, got a nested list");
    }
    if (spec_->text_args.count(key) != 0) {
      fail(
          key,
          fmt::format("must be a number or a list of numbers, got '{}'", spec_->text_args.at(key)));
    }
    fail(key, "is required but missing");
  }
  return it->second;
}

std::vector<double>
TransformArgs::numbers(const std::string& key, std::vector<double> fallback) const {
  return has(key) ? numbers(key) : std::move(fallback);
}

double TransformArgs::number(const std::string& key) const {
  const std::vector<double>& values = numbers(key);
  if (values.size() != 1) {
    fail(key, fmt::format("takes one value, got {}", values));
  }
  return values[0];
}

double TransformArgs::number(const std::string& key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

int64_t TransformArgs::integer(const std::string& key) const {
  const double value = number(key);
  if (!std::isfinite(value) || value != std::floor(value)) {
    fail(key, fmt::format("must be an integer, got {}", value));
  }
  return static_cast<int64_t>(value);
}

int64_t TransformArgs::integer(const std::string& key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

std::pair<int64_t, int64_t> TransformArgs::size(const std::string& key) const {
  const std::vector<double>& values = numbers(key);
  if (values.size() != 1 && values.size() != 2) {
    fail(key, fmt::format("takes [s] or [h, w], got {}", values));
  }
  for (const double value : values) {
    if (!std::isfinite(value) || value != std::floor(value) || value < 1) {
      fail(key, fmt::format("must hold whole numbers >= 1, got {}", values));
    }
  }
  return {static_cast<int64_t>(values[0]), static_cast<int64_t>(values.back())};
}

std::string TransformArgs::text(const std::string& key, const std::string& fallback) const {
  const auto it = spec_->text_args.find(key);
  if (it != spec_->text_args.end()) {
    return it->second;
  }
  if (spec_->args.count(key) != 0) {
    const double value = number(key);
    return value == std::floor(value) ? std::to_string(static_cast<int64_t>(value))
                                      : fmt::format("{}", value);
  }
  return fallback;
}

double TransformArgs::probability(const std::string& key, double fallback) const {
  const double p = number(key, fallback);
  if (!(p >= 0.0 && p <= 1.0)) {
    fail(key, fmt::format("must be a probability in [0, 1], got {}", p));
  }
  return p;
}

} // namespace largo::data
