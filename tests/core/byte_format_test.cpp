// format_bytes: the one formatter of sizes in logs, errors and `largo estimate`.
#include <largo/core/byte_format.h>

#include <gtest/gtest.h>

#include <cstdint>

namespace largo::byte_format_test {
namespace {

TEST(ByteFormatTest, BinaryUnitsWithTwoDecimals) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(12 * 1024 * 1024), "12.00 MiB");
  EXPECT_EQ(format_bytes(static_cast<double>(int64_t{3} << 29)), "1.50 GiB");
  EXPECT_EQ(format_bytes(static_cast<double>(uint64_t{1} << 60)), "1.00 EiB");
  // Past the largest unit the count grows in EiB (require_memory's saturated products).
  EXPECT_EQ(format_bytes(static_cast<double>(UINT64_MAX)), "16.00 EiB");
}

TEST(ByteFormatTest, NegativeCountsKeepTheirSign) {
  EXPECT_EQ(format_bytes(-512), "-512 B");
  EXPECT_EQ(format_bytes(-2.5 * 1024 * 1024), "-2.50 MiB");
}

} // namespace
} // namespace largo::byte_format_test
