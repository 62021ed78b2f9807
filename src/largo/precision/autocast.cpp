#include <largo/precision/autocast.h>

#include <largo/core/torch_compat.h>

namespace largo::precision {

AutocastGuard::AutocastGuard(c10::DeviceType device_type, at::ScalarType dtype, bool enabled)
    : device_type_(device_type),
      previous_enabled_(compat::is_autocast_enabled(device_type)),
      previous_dtype_(compat::get_autocast_dtype(device_type)) {
  compat::set_autocast_enabled(device_type_, enabled);
  compat::set_autocast_dtype(device_type_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // The cache is only valid inside the outermost scope: after it, weights may change.
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  compat::set_autocast_enabled(device_type_, previous_enabled_);
  compat::set_autocast_dtype(device_type_, previous_dtype_);
}

} // namespace largo::precision
