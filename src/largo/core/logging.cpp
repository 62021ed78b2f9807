#include <largo/core/logging.h>

#include <largo/core/libtorch_log.h>

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
  route_libtorch_logs();
}

} // namespace largo
