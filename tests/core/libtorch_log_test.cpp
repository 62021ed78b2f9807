// libtorch's own log records (c10's LOG, c10d's warnings, TORCH_WARN from any thread) reach
// Largo's log at debug level without stack frames, and everything else written to std::cerr
// passes through unchanged.
#include <largo/core/libtorch_log.h>
#include <largo/core/logging.h>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <iostream>
#include <sstream>
#include <thread>

namespace largo::libtorch_log_test {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A c10::Error's text as c10d embeds it in its warnings: the message, then "Exception raised
// from ..." and the frames.
std::string c10_error_text() {
  try {
    TORCH_CHECK(false, "Connection reset by peer");
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "";
}

TEST(LibtorchLogTest, ParsesAC10RecordWithoutItsStackTrace) {
  const std::string text = "[W106 06:14:30.123456 4242 TCPStore.cpp:125] [c10d] recvValue "
                           "failed: Connection reset by peer\nException raised from recvBytes "
                           "at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:682 (most recent "
                           "call first):\nframe #0: c10::Error::Error() + 0x98 (0x7f in "
                           "libc10.so)\nframe #1: <unknown function> + 0x5e (0x7f in "
                           "libtorch_cpu.so)\n\n";
  auto record = parse_libtorch_log_record(text);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->severity, 'W');
  EXPECT_EQ(record->origin, "TCPStore.cpp:125");
  EXPECT_EQ(record->message, "[c10d] recvValue failed: Connection reset by peer");
  EXPECT_FALSE(parse_libtorch_log_record("largo: error: rank 1 died\n").has_value());
  EXPECT_FALSE(parse_libtorch_log_record("[rank 1] warning\n").has_value());
  EXPECT_FALSE(parse_libtorch_log_record("").has_value());
}

TEST(LibtorchLogTest, RecordsGoToTheDebugLogAndOtherTextToStderr) {
  init_logging(/*rank=*/0, /*verbose=*/true); // routes libtorch's records
  std::ostringstream debug_log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(debug_log);
  spdlog::default_logger()->sinks().push_back(sink);

  ::testing::internal::CaptureStderr();
  const std::string error_text = c10_error_text();
  ASSERT_TRUE(contains(error_text, "Exception raised from")) << error_text;
  LOG(WARNING) << "[c10d] recvValue failed on SocketImpl: " << error_text;
  // TORCH_WARN from a thread of libtorch's: c10's default warning handler logs it.
  std::thread([] { TORCH_WARN("a libtorch warning from another thread"); }).join();
  std::cerr << "not a libtorch record" << std::endl;
  const std::string stderr_text = ::testing::internal::GetCapturedStderr();
  spdlog::default_logger()->sinks().pop_back();
  const std::string logged = debug_log.str();

  EXPECT_FALSE(contains(stderr_text, "frame #")) << stderr_text;
  EXPECT_FALSE(contains(stderr_text, "Exception raised from")) << stderr_text;
  EXPECT_FALSE(contains(stderr_text, "recvValue")) << stderr_text;
  EXPECT_TRUE(contains(stderr_text, "not a libtorch record\n")) << stderr_text;
  EXPECT_TRUE(contains(logged, "libtorch warning")) << logged;
  EXPECT_TRUE(contains(logged, "[c10d] recvValue failed on SocketImpl: Connection reset by peer"))
      << logged;
  EXPECT_TRUE(contains(logged, "a libtorch warning from another thread")) << logged;
  EXPECT_FALSE(contains(logged, "frame #")) << logged;
  EXPECT_FALSE(contains(logged, "Exception raised from")) << logged;
  init_logging(0, false);
}

} // namespace
} // namespace largo::libtorch_log_test
