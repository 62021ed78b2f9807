// Rank-aware console logging on top of spdlog. Rank 0 logs at the configured level;
// other ranks log warnings and errors only, prefixed with their rank, so a multi-process
// job prints one stream of progress but every rank's problems.
#pragma once

#include <spdlog/spdlog.h>

namespace largo {

// Configure the default spdlog logger for this process, and route libtorch's own log records
// into it at debug level (libtorch_log.h). Call once at start-up (the trainer does); safe to
// call again, e.g. after the rank is known.
void init_logging(int rank = 0, bool verbose = false);

} // namespace largo
