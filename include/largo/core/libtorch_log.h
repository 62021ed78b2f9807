// libtorch's own log records routed into Largo's logging (logging.h), at debug level and
// without C++ stack traces.
//
// Why: libtorch writes warnings and errors straight to stderr from any thread: c10's LOG(...)
// records, c10d's "[c10d] ..." warnings (the TCPStore client's, when the rank that serves
// the store dies: one warning with a 28-frame stack trace), and TORCH_WARN (c10's default
// WarningHandler logs through the same LOG; set_warning_handler only replaces it for the
// calling thread). A user would read those stack frames before Largo's own error, which
// already names the rank that died and what to do. Routed, they reach the log at debug level
// (VERBOSE=True on rank 0 shows them), one line each, with their severity and origin; a
// fatal record (which precedes an abort) at error level, still without its stack trace.
//
// How (libtorch 2.11 without glog, torch_compat.h): every c10 log record is one insertion into
// std::cerr ("[W106 12:00:00.123456 file.cpp:42] message\n") followed by a flush, so a
// stream buffer in front of std::cerr's forwards records that start like one, and passes
// everything else through to stderr unchanged, in order.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace largo {

// Installs the routing for this process; idempotent, thread-safe. init_logging() calls it.
void route_libtorch_logs();

// One c10 log record parsed: its severity letter (F, E, W, I, V) and the message after the
// record's "[W... file:line] " header, stack traces removed; nullopt for text that is not a
// c10 record.
struct LibtorchLogRecord {
  char severity = 'W';
  std::string origin;  // "TCPStore.cpp:123"
  std::string message; // without stack frames, without the trailing newline
};
std::optional<LibtorchLogRecord> parse_libtorch_log_record(std::string_view text);

} // namespace largo
