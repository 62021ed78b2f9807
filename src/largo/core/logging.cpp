#include <largo/core/logging.h>

#include <fmt/format.h>

namespace largo {

void init_logging(int rank, bool verbose) {
  spdlog::set_pattern(rank == 0 ? "%Y-%m-%d %H:%M:%S %^%l%$ %v"
                                : fmt::format("%Y-%m-%d %H:%M:%S [rank {}] %^%l%$ %v", rank));
  if (rank == 0) {
    spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  } else {
    spdlog::set_level(spdlog::level::warn);
  }
}

} // namespace largo
