// A transform as a config names it -- {name: RandomResizedCrop, size: 224, scale: [0.08, 1]}
// -- and the checked reading of its arguments that both transform factories (batch-level,
// transforms.h; per-sample, sample_pipeline.h) share.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace largo::data {

// Scalars are one-element lists. Words (interpolation: bilinear) go to text_args.
struct TransformSpec {
  TransformSpec() = default;
  TransformSpec(
      std::string name,
      std::map<std::string, std::vector<double>> args = {},
      std::map<std::string, std::string> text_args = {})
      : name(std::move(name)), args(std::move(args)), text_args(std::move(text_args)) {}

  std::string name;
  std::map<std::string, std::vector<double>> args;
  std::map<std::string, std::string> text_args;
  // Lists of lists: ImgPilToMultiCrop's crop_scales [[0.14, 1], [0.05, 0.14]].
  std::map<std::string, std::vector<std::vector<double>>> nested_args;
  // Lists of transforms: ImgPilMultiCropRandomApply's transforms.
  std::map<std::string, std::vector<TransformSpec>> transform_args;

  bool operator==(const TransformSpec& other) const = default;
};

// Reads one spec's arguments. Every error is a ConfigError that names the transform, the
// argument, the value and what was expected.
class TransformArgs {
 public:
  // Throws for an argument not in `allowed` (a typo would otherwise be silently ignored).
  TransformArgs(const TransformSpec& spec, const std::set<std::string>& allowed);

  bool has(const std::string& key) const;
  // A list of numbers; required, or `fallback` when absent.
  const std::vector<double>& numbers(const std::string& key) const;
  std::vector<double> numbers(const std::string& key, std::vector<double> fallback) const;
  // One number.
  double number(const std::string& key) const;
  double number(const std::string& key, double fallback) const;
  // One whole number.
  int64_t integer(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t fallback) const;
  // [s] -> (s, s) or [h, w] -> (h, w), whole numbers > 0.
  std::pair<int64_t, int64_t> size(const std::string& key) const;
  // A word, or a number written as text (interpolation: 2 -> "2").
  std::string text(const std::string& key, const std::string& fallback) const;
  // A number in [0, 1].
  double probability(const std::string& key, double fallback) const;
  // A list of lists of numbers (nested_args); required.
  const std::vector<std::vector<double>>& nested_numbers(const std::string& key) const;
  // A list of transforms (transform_args); required.
  const std::vector<TransformSpec>& transforms(const std::string& key) const;

  // A ConfigError naming this transform and `key`.
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  const TransformSpec* spec_;
};

} // namespace largo::data
