// The error boundary: stack frames never reach the user, each failure class has its exit
// code, and libtorch's out-of-memory error becomes a resource error.
#include <largo/core/error.h>
#include <largo/core/error_report.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <new>

namespace largo::error_report_test {
namespace {

ErrorReport report_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (...) {
    return report_error(std::current_exception());
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

TEST(ErrorReportTest, LibtorchErrorsLoseTheirStackFrames) {
  // A real c10::Error, with its "Exception raised from" line and frames.
  const ErrorReport report =
      report_of([] { TORCH_CHECK(false, "shape '[4]' is invalid for input of size 6"); });
  EXPECT_NE(report.full_text.find("frame #0"), std::string::npos) << report.full_text;
  EXPECT_EQ(report.message.find("frame #"), std::string::npos) << report.message;
  EXPECT_EQ(report.message.find("Exception raised from"), std::string::npos) << report.message;
  EXPECT_NE(report.message.find("shape '[4]' is invalid for input of size 6"), std::string::npos)
      << report.message;
  EXPECT_EQ(report.exit_code, kExitInternalError);
  EXPECT_EQ(report.label, "internal error");
}

TEST(ErrorReportTest, FramesEmbeddedInAnotherMessageAreRemoved) {
  const std::string text =
      "collective all_reduce on rank 0 failed: [../third_party/gloo/gloo/transport/tcp/"
      "unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to complete\n"
      "Exception raised from wait at ../torch/csrc/distributed/c10d/ProcessGroupGloo.cpp:123 "
      "(most recent call first):\n"
      "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9e (0x7f in libc10.so)\n"
      "frame #12: <unknown function> + 0x2724a (0x7fe in libc.so.6)\n"
      "\n"
      "; rank 1 stopped responding";
  const std::string cleaned = without_stack_trace(text);
  EXPECT_EQ(
      cleaned,
      "collective all_reduce on rank 0 failed: [../third_party/gloo/gloo/transport/tcp/"
      "unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to complete\n"
      "; rank 1 stopped responding");
  // A line that merely mentions a frame number is kept.
  EXPECT_EQ(without_stack_trace("see frame #3 of the video"), "see frame #3 of the video");
}

TEST(ErrorReportTest, EachClassHasItsExitCode) {
  EXPECT_EQ(report_of([] { throw ConfigError("c"); }).exit_code, 2);
  EXPECT_EQ(report_of([] { throw DataError("d"); }).exit_code, 3);
  EXPECT_EQ(report_of([] { throw CheckpointError("k"); }).exit_code, 4);
  EXPECT_EQ(report_of([] { throw ResourceError("r"); }).exit_code, 5);
  EXPECT_EQ(report_of([] { throw CommError("m"); }).exit_code, 6);
  EXPECT_EQ(report_of([] { throw TrainingError("t"); }).exit_code, 7);
  EXPECT_EQ(report_of([] { throw WorkerError("w"); }).exit_code, 1);
  EXPECT_EQ(report_of([] { throw std::runtime_error("x"); }).exit_code, 70);
  const ErrorReport config = report_of([] { throw ConfigError("config key A = 1: expected B"); });
  EXPECT_EQ(config.label, "config error");
  EXPECT_EQ(config.message, "config key A = 1: expected B");
}

TEST(ErrorReportTest, OutOfMemoryIsAResourceError) {
  ErrorReport report = report_of([] { throw std::bad_alloc(); });
  EXPECT_EQ(report.exit_code, kExitResourceError);
  EXPECT_NE(report.message.find("available"), std::string::npos) << report.message;
  report = report_of([] {
    TORCH_CHECK(
        false, "DefaultCPUAllocator: not enough memory: you tried to allocate 4294967296 bytes.");
  });
  EXPECT_EQ(report.exit_code, kExitResourceError);
  EXPECT_NE(report.message.find("an allocation of 4.00 GiB failed"), std::string::npos)
      << report.message;
}

} // namespace
} // namespace largo::error_report_test
