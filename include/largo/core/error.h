// Error types Largo throws for user-facing failures. Library code throws; only the
// `largo` program's main() turns an error into a message and an exit code.
// Each message says what is wrong and what to do about it.
#pragma once

#include <stdexcept>
#include <string>

namespace largo {

// Base of every error Largo raises on purpose (bad input, bad files, bad state).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration key is unknown, has the wrong type or an out-of-range value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A library option (a field of a component's options struct) has a value the component
// cannot use: "option FullyShardedDataParallelOptions::fp32_reduce_scatter = true: expected
// ...". Library code names its own options; the config layer (train/option_keys.h) rethrows it
// as a ConfigError naming the YAML key the user wrote, with the same value and expectation.
class OptionError : public ConfigError {
 public:
  OptionError(std::string option, std::string value, std::string expected)
      : ConfigError("option " + option + " = " + value + ": expected " + expected),
        option_(std::move(option)),
        value_(std::move(value)),
        expected_(std::move(expected)) {}
  const std::string& option() const {
    return option_;
  }
  const std::string& value() const {
    return value_;
  }
  const std::string& expected() const {
    return expected_;
  }

 private:
  std::string option_;
  std::string value_;
  std::string expected_;
};

// How a component states one rule of its options: throws OptionError(option, value,
// expected) unless `ok`. `option` is the library's name ("SwavQueueOptions::length"),
// `value` the value as given, `expected` what would be accepted ("an integer > 0").
inline void require_option(
    bool ok, const std::string& option, const std::string& value, const std::string& expected) {
  if (!ok) {
    throw OptionError(option, value, expected);
  }
}

// A dataset file is missing, truncated or not in the expected format.
class DataError : public Error {
 public:
  using Error::Error;
};

// A checkpoint file is missing, truncated, foreign or does not match the model.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// A collective or the rendezvous failed: a peer process died or stalled, the master
// could not be reached, a port is taken, or the ranks disagree about the job.
class CommError : public Error {
 public:
  using Error::Error;
};

// A worker process started by the launcher (largo launch, a self-spawning largo train)
// exited non-zero or was killed; the message names its rank and how it ended.
class WorkerError : public Error {
 public:
  using Error::Error;
};

// The machine lacks what was asked for: memory for a tensor, dataset or model; more
// processes or threads than it has cores. The message says how much was asked (and by
// which key or component) and how much there is.
class ResourceError : public Error {
 public:
  using Error::Error;
};

// Training cannot go on (e.g. a non-finite loss).
class TrainingError : public Error {
 public:
  using Error::Error;
};

} // namespace largo
