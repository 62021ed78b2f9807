// The error boundary: what the user reads when an operation fails, and the process's exit
// code. Library code throws largo::Error subclasses (error.h) whose messages name the key or
// file; errors from libtorch (c10::Error) and the standard library carry C++ stack frames
// ("Exception raised from ...", "frame #0: ...") that tell a user nothing. report_error()
// removes them (the full text goes to the debug log), turns the few libtorch failures a user
// can cause and act on (out of memory) into their class, and picks the exit code:
//
//   0   success
//   1   a worker process failed (largo launch, a self-spawning largo train; the worker's
//       own message above says why), or another failure
//   2   bad usage or config (ConfigError): nothing ran
//   3   a dataset is missing, damaged or does not fit the model (DataError)
//   4   a checkpoint is missing, damaged, foreign or does not match (CheckpointError)
//   5   the machine lacks memory or cores for what was asked (ResourceError)
//   6   communication failed: a rank stalled or died, a collective timed out (CommError)
//   7   training cannot go on, e.g. a non-finite loss (TrainingError)
//   70  an internal error: an unexpected exception, a bug to report (with VERBOSE=True's log)
//   128+N  largo launch / a self-spawning largo train forwarded signal N to the workers
//
// docs/errors.md lists the same table for users.
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace largo {

enum ExitCode : int {
  kExitSuccess = 0,
  kExitFailure = 1,
  kExitBadConfig = 2,
  kExitDataError = 3,
  kExitCheckpointError = 4,
  kExitResourceError = 5,
  kExitCommError = 6,
  kExitTrainingError = 7,
  kExitInternalError = 70,
};

struct ErrorReport {
  int exit_code = kExitFailure;
  std::string label;     // "config error", "checkpoint error", "internal error", ...
  std::string message;   // what the user reads: no stack frames
  std::string full_text; // the exception's whole text, for the debug log
};

// `text` without C++ stack traces: the lines from "Exception raised from ..." up to the last
// "frame #N: ..." line, and any other "frame #N" line, wherever they appear (c10::Error text
// is often embedded in another message). Trailing blank lines go too.
std::string without_stack_trace(std::string_view text);

// The environment variable a launcher (comm/launcher.h) sets for each worker: the file
// where the worker's error boundary writes its one-line error, so the launcher's own error
// can say why the worker failed.
constexpr const char* kErrorReportVariable = "LARGO_ERROR_REPORT_FILE";

// Writes "<label>: <message>" (one line) to the file named by kErrorReportVariable, when it is
// set; does nothing otherwise, and never throws.
void publish_error_report(const ErrorReport& report);

// The report for an exception (call inside a catch block with std::current_exception(), or
// with any exception_ptr).
ErrorReport report_error(const std::exception_ptr& error);

} // namespace largo
