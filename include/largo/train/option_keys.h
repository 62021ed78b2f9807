// Errors in the user's words: library code names its own options (OptionError:
// "option FullyShardedDataParallelOptions::fp32_reduce_scatter = false: expected ..."), and a
// `largo` user who wrote YAML must read the key they wrote. This is the one table that maps
// the library's option names to VISSL's keys; the config layer runs library calls through
// rethrow_with_yaml_keys.
#pragma once

#include <largo/core/error.h>

#include <exception>
#include <string>

namespace largo::train {

// The YAML key for a library option ("MODEL.FSDP_CONFIG.fp32_reduce_scatter"), or the
// option's own name when no key sets it.
std::string yaml_key_for(const std::string& option);

// `text` with every option name of the table (and every "option = value" phrase it lists)
// replaced by its YAML key: what an OptionError's expectation says of other options.
std::string with_yaml_keys(std::string text);

// Rethrows `error` in the user's words: an OptionError as a ConfigError naming the YAML key,
// with the same value and the expectation in YAML keys; any other largo::Error as the same
// class with every option name in its message replaced by its key (unchanged when it names
// none). Anything else is rethrown as it is.
[[noreturn]] void rethrow_in_yaml_keys(std::exception_ptr error);

// Runs `call`; a largo::Error it throws is rethrown in YAML keys (rethrow_in_yaml_keys). The
// config layer runs the library's calls through this, and the `largo` program its commands.
template <typename Call>
decltype(auto) rethrow_with_yaml_keys(Call&& call) {
  try {
    return call();
  } catch (const Error&) {
    rethrow_in_yaml_keys(std::current_exception());
  }
}

} // namespace largo::train
