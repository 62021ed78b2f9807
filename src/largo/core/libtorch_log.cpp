#include <largo/core/libtorch_log.h>

#include <largo/core/error_report.h>
#include <largo/core/torch_compat.h>

#include <spdlog/spdlog.h>

#include <cctype>
#include <iostream>
#include <mutex>
#include <streambuf>

namespace largo {
namespace {

// Sits in front of std::cerr's original buffer. Text is collected per thread (so records of
// two threads never mix) and handled at each flush: std::cerr is unit-buffered, so every
// insertion ends with one, and c10 writes a record in one insertion.
class RoutingBuffer : public std::streambuf {
 public:
  explicit RoutingBuffer(std::streambuf* stderr_buffer) : stderr_buffer_(stderr_buffer) {}

 protected:
  int_type overflow(int_type ch) override {
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      pending().push_back(traits_type::to_char_type(ch));
    }
    return traits_type::not_eof(ch);
  }

  std::streamsize xsputn(const char* text, std::streamsize count) override {
    pending().append(text, static_cast<size_t>(count));
    return count;
  }

  int sync() override {
    std::string text;
    text.swap(pending());
    if (text.empty()) {
      return 0;
    }
    if (auto record = parse_libtorch_log_record(text)) {
      // A fatal record precedes an abort, which it alone explains: shown, without its trace.
      spdlog::log(
          record->severity == 'F' ? spdlog::level::err : spdlog::level::debug,
          "libtorch {} ({}): {}",
          severity_word(record->severity),
          record->origin,
          record->message);
      return 0;
    }
    std::lock_guard<std::mutex> lock(stderr_mutex_);
    stderr_buffer_->sputn(text.data(), static_cast<std::streamsize>(text.size()));
    return stderr_buffer_->pubsync();
  }

 private:
  static std::string& pending() {
    thread_local std::string text;
    return text;
  }

  static const char* severity_word(char severity) {
    switch (severity) {
    case 'F':
      return "fatal error";
    case 'E':
      return "error";
    case 'W':
      return "warning";
    default:
      return "info";
    }
  }

  std::streambuf* stderr_buffer_;
  std::mutex stderr_mutex_;
};

} // namespace

std::optional<LibtorchLogRecord> parse_libtorch_log_record(std::string_view text) {
  // "[W106 12:00:00.123456 12345 TCPStore.cpp:123] message": a severity letter, then the
  // month and day as digits, then the time (and, in some releases, the thread id) and the
  // source file and line.
  if (text.size() < 4 || text[0] != '[' ||
      std::string_view("FEWIV").find(text[1]) == std::string_view::npos ||
      !std::isdigit(static_cast<unsigned char>(text[2]))) {
    return std::nullopt;
  }
  const size_t header_end = text.find("] ");
  const size_t first_newline = text.find('\n');
  if (header_end == std::string_view::npos || header_end > first_newline) {
    return std::nullopt;
  }
  LibtorchLogRecord record;
  record.severity = text[1];
  const std::string_view header = text.substr(1, header_end - 1);
  const size_t last_space = header.rfind(' ');
  record.origin =
      std::string(last_space == std::string_view::npos ? header : header.substr(last_space + 1));
  record.message = without_stack_trace(text.substr(header_end + 2));
  return record;
}

void route_libtorch_logs() {
  if (!compat::libtorch_logs_to_std_cerr()) {
    return; // a glog build logs through glog's own sinks
  }
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: libtorch may log from its threads until the process ends.
    static auto* buffer = new RoutingBuffer(std::cerr.rdbuf());
    std::cerr.rdbuf(buffer);
  });
}

} // namespace largo
