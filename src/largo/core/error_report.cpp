#include <largo/core/error_report.h>

#include <largo/core/byte_format.h>
#include <largo/core/error.h>
#include <largo/core/resources.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>

namespace largo {
namespace {

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// "frame #12: ..." (c10's backtrace lines), with or without leading spaces.
bool is_frame_line(std::string_view line) {
  const size_t start = line.find_first_not_of(' ');
  if (start == std::string_view::npos || !starts_with(line.substr(start), "frame #")) {
    return false;
  }
  const std::string_view rest = line.substr(start + 7);
  const size_t digits = rest.find_first_not_of("0123456789");
  return digits > 0 && digits != std::string_view::npos && rest[digits] == ':';
}

// c10 says "DefaultCPUAllocator: not enough memory: you tried to allocate 4000000 bytes."
std::optional<uint64_t> failed_allocation_bytes(const std::string& text) {
  const std::string marker = "you tried to allocate ";
  const size_t at = text.find(marker);
  if (text.find("not enough memory") == std::string::npos || at == std::string::npos) {
    return std::nullopt;
  }
  return std::strtoull(text.c_str() + at + marker.size(), nullptr, 10);
}

ErrorReport classify(const std::exception& e, int exit_code, const char* label) {
  ErrorReport report;
  report.exit_code = exit_code;
  report.label = label;
  report.full_text = e.what();
  report.message = without_stack_trace(report.full_text);
  return report;
}

ErrorReport out_of_memory(const std::string& full_text, std::optional<uint64_t> bytes) {
  ErrorReport report;
  report.exit_code = kExitResourceError;
  report.label = "out of memory";
  report.full_text = full_text;
  // (The allocation guard, resources.h, refuses large allocations earlier with the name of
  // what asked; this is memory running out over many smaller ones.)
  report.message = fmt::format(
      "an allocation{} failed; this machine has {} available. Use smaller sizes (batch, "
      "model, dataset, DATA.NUM_DATALOADER_WORKERS), or a machine with more memory.",
      bytes ? " of " + format_bytes(*bytes) : "",
      format_bytes(available_memory_bytes()));
  return report;
}

} // namespace

std::string without_stack_trace(std::string_view text) {
  std::ostringstream out;
  bool in_trace = false;
  bool first = true;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (starts_with(line, "Exception raised from ")) {
      in_trace = true; // c10: the throw site, then "frame #N" lines until the message ends
      continue;
    }
    if (is_frame_line(line)) {
      continue;
    }
    if (in_trace && line.empty()) {
      continue;
    }
    in_trace = false;
    out << (first ? "" : "\n") << line;
    first = false;
  }
  std::string cleaned = out.str();
  while (!cleaned.empty() && (cleaned.back() == '\n' || cleaned.back() == ' ')) {
    cleaned.pop_back();
  }
  return cleaned;
}

void publish_error_report(const ErrorReport& report) {
  const char* path = std::getenv(kErrorReportVariable);
  if (path == nullptr || *path == '\0') {
    return;
  }
  std::string line = report.label + ": " + report.message;
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::ofstream out(path, std::ios::trunc);
  out << line << "\n"; // a failed write only loses the launcher's summary
}

ErrorReport report_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const ConfigError& e) {
    return classify(e, kExitBadConfig, "config error");
  } catch (const DataError& e) {
    return classify(e, kExitDataError, "data error");
  } catch (const CheckpointError& e) {
    return classify(e, kExitCheckpointError, "checkpoint error");
  } catch (const ResourceError& e) {
    return classify(e, kExitResourceError, "out of resources");
  } catch (const CommError& e) {
    return classify(e, kExitCommError, "communication error");
  } catch (const TrainingError& e) {
    return classify(e, kExitTrainingError, "training error");
  } catch (const Error& e) {
    return classify(e, kExitFailure, "error");
  } catch (const std::bad_alloc& e) {
    return out_of_memory(e.what(), std::nullopt);
  } catch (const c10::Error& e) {
    const std::string text = e.what();
    if (auto bytes = failed_allocation_bytes(text)) {
      return out_of_memory(text, bytes);
    }
    ErrorReport report = classify(e, kExitInternalError, "internal error");
    report.message = without_stack_trace(e.what_without_backtrace()) +
                     "\n(an unexpected libtorch error: please report it with the log of a run with "
                     "VERBOSE=True)";
    return report;
  } catch (const std::exception& e) {
    return classify(e, kExitInternalError, "internal error");
  } catch (...) {
    ErrorReport report;
    report.exit_code = kExitInternalError;
    report.label = "internal error";
    report.message = report.full_text = "an exception that is not a std::exception";
    return report;
  }
}

} // namespace largo
