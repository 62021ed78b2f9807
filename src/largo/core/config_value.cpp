#include <largo/core/config_value.h>

#include <largo/core/config.h>

namespace largo {
namespace {

bool both_bools(const YAML::Node& a, const YAML::Node& b) {
  return yaml_scalar_is_bool(a) && yaml_scalar_is_bool(b);
}

} // namespace

bool same_config_value(const YAML::Node& a, const YAML::Node& b) {
  if (!a.IsDefined() || !b.IsDefined() || a.IsNull() || b.IsNull()) {
    return (!a.IsDefined() || a.IsNull()) && (!b.IsDefined() || b.IsNull());
  }
  if (a.Type() != b.Type()) {
    return false;
  }
  if (a.IsScalar()) {
    if (both_bools(a, b)) {
      return yaml_to_bool(a, "") == yaml_to_bool(b, "");
    }
    if (yaml_scalar_is_number(a) && yaml_scalar_is_number(b)) {
      return yaml_to_double(a, "") == yaml_to_double(b, "");
    }
    return a.Scalar() == b.Scalar();
  }
  if (a.IsSequence()) {
    if (a.size() != b.size()) {
      return false;
    }
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same_config_value(a[i], b[i])) {
        return false;
      }
    }
    return true;
  }
  if (a.size() != b.size()) {
    return false;
  }
  for (const auto& entry : a) {
    const YAML::Node other = b[entry.first.Scalar()];
    if (!other.IsDefined() || !same_config_value(entry.second, other)) {
      return false;
    }
  }
  return true;
}

std::string config_value_text(const YAML::Node& value) {
  if (!value.IsDefined() || value.IsNull()) {
    return "null";
  }
  YAML::Emitter out;
  out << YAML::Flow << value;
  return out.c_str();
}

} // namespace largo
