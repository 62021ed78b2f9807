// Byte counts for people: the one formatter of log lines, errors and `largo estimate`'s
// tables, so the same size reads the same everywhere.
#pragma once

#include <string>

namespace largo {

// "512 B", "1.50 KiB", "12.00 MiB", "3.00 GiB", up to EiB; negative counts (a memory
// window that shrank) keep their sign. Binary units, two decimals above bytes.
std::string format_bytes(double bytes);

} // namespace largo
