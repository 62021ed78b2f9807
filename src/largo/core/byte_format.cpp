#include <largo/core/byte_format.h>

#include <fmt/format.h>

#include <cmath>
#include <iterator>

namespace largo {

std::string format_bytes(double bytes) {
  constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = bytes;
  size_t unit = 0;
  while (std::abs(value) >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", value) : fmt::format("{:.2f} {}", value, units[unit]);
}

} // namespace largo
