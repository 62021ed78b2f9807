// Config values compared and printed as a user wrote them: shared by the checks that
// accept a key only at its default (train/unavailable_keys.h, core/vissl_keys.h).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace largo {

// Whether two YAML values are the same config value: True == true, 1e-5 == 0.00001, lists
// and maps element by element, null only equal to null.
bool same_config_value(const YAML::Node& a, const YAML::Node& b);

// A value as it would be written in a config: True, 0.5, "text", [1, 2], {a: 1}.
std::string config_value_text(const YAML::Node& value);

} // namespace largo
