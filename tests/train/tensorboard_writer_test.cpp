// Tests for TensorBoardWriter and its wire helpers. The event files are checked twice, by
// two decoders written apart from the writer: the C++ one below (with a bit-by-bit CRC32C)
// and tests/reference/read_tfevents.py (standard-library Python, table-based CRC32C).
#include "largo/train/tensorboard_writer.h"

#include "../../src/largo/train/protobuf_wire.h"
#include "largo/core/error.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace wire = largo::train::wire;
using largo::train::TensorBoardWriter;

namespace tensorboard_writer_test {
namespace {

// ---- an independent decoder ------------------------------------------------------------

// Bit-at-a-time CRC32C: deliberately not the table the writer uses.
uint32_t bitwise_crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) {
    crc ^= static_cast<uint8_t>(c);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
  }
  return ~crc;
}

uint32_t bitwise_masked_crc32c(std::string_view bytes) {
  const uint32_t crc = bitwise_crc32c(bytes);
  return std::rotr(crc, 15) + 0xA282EAD8u;
}

uint64_t read_le(std::string_view bytes, size_t offset, int num_bytes) {
  if (offset + num_bytes > bytes.size()) {
    throw std::runtime_error("truncated fixed-width value");
  }
  uint64_t value = 0;
  for (int i = 0; i < num_bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

// The payloads of all TFRecords in `blob`; throws if a length or CRC is wrong.
std::vector<std::string> read_records(std::string_view blob) {
  std::vector<std::string> payloads;
  size_t offset = 0;
  while (offset < blob.size()) {
    const std::string_view length_bytes = blob.substr(offset, 8);
    const uint64_t length = read_le(blob, offset, 8);
    if (read_le(blob, offset + 8, 4) != bitwise_masked_crc32c(length_bytes)) {
      throw std::runtime_error("bad length CRC");
    }
    const size_t start = offset + 12;
    if (start + length + 4 > blob.size()) {
      throw std::runtime_error("truncated payload");
    }
    const std::string_view payload = blob.substr(start, length);
    if (read_le(blob, start + length, 4) != bitwise_masked_crc32c(payload)) {
      throw std::runtime_error("bad payload CRC");
    }
    payloads.emplace_back(payload);
    offset = start + length + 4;
  }
  return payloads;
}

struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t varint = 0; // wire type 0
  std::string bytes;   // wire types 1, 2, 5
};

uint64_t read_varint(std::string_view data, size_t& offset) {
  uint64_t value = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (offset >= data.size()) {
      throw std::runtime_error("truncated varint");
    }
    const auto byte = static_cast<uint8_t>(data[offset++]);
    value |= static_cast<uint64_t>(byte & 0x7Fu) << shift;
    if ((byte & 0x80u) == 0) {
      return value;
    }
  }
  throw std::runtime_error("varint longer than 10 bytes");
}

std::vector<Field> parse_fields(std::string_view data) {
  std::vector<Field> fields;
  size_t offset = 0;
  while (offset < data.size()) {
    const uint64_t key = read_varint(data, offset);
    Field field;
    field.number = static_cast<uint32_t>(key >> 3);
    field.wire_type = static_cast<uint32_t>(key & 7u);
    size_t num_bytes = 0;
    switch (field.wire_type) {
    case 0:
      field.varint = read_varint(data, offset);
      break;
    case 1:
      num_bytes = 8;
      break;
    case 2:
      num_bytes = read_varint(data, offset);
      break;
    case 5:
      num_bytes = 4;
      break;
    default:
      throw std::runtime_error("unexpected wire type");
    }
    if (offset + num_bytes > data.size()) {
      throw std::runtime_error("field past the end of its message");
    }
    field.bytes = std::string(data.substr(offset, num_bytes));
    offset += num_bytes;
    fields.push_back(std::move(field));
  }
  return fields;
}

double as_double(const Field& field) {
  EXPECT_EQ(field.wire_type, 1u) << "field " << field.number;
  return std::bit_cast<double>(read_le(field.bytes, 0, 8));
}

struct DecodedHistogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;
};

struct DecodedValue {
  std::string tag;
  std::optional<float> simple_value;
  std::optional<DecodedHistogram> histo;
};

struct DecodedEvent {
  std::optional<double> wall_time;
  std::optional<int64_t> step;
  std::optional<std::string> file_version;
  std::vector<DecodedValue> values;
};

std::vector<double> packed_doubles(const Field& field) {
  EXPECT_EQ(field.wire_type, 2u);
  EXPECT_EQ(field.bytes.size() % 8, 0u);
  std::vector<double> values;
  for (size_t offset = 0; offset + 8 <= field.bytes.size(); offset += 8) {
    values.push_back(std::bit_cast<double>(read_le(field.bytes, offset, 8)));
  }
  return values;
}

DecodedHistogram decode_histogram(std::string_view data) {
  DecodedHistogram histo;
  for (const Field& field : parse_fields(data)) {
    switch (field.number) {
    case 1:
      histo.min = as_double(field);
      break;
    case 2:
      histo.max = as_double(field);
      break;
    case 3:
      histo.num = as_double(field);
      break;
    case 4:
      histo.sum = as_double(field);
      break;
    case 5:
      histo.sum_squares = as_double(field);
      break;
    case 6:
      histo.bucket_limit = packed_doubles(field);
      break;
    case 7:
      histo.bucket = packed_doubles(field);
      break;
    default:
      ADD_FAILURE() << "unexpected HistogramProto field " << field.number;
    }
  }
  return histo;
}

DecodedValue decode_value(std::string_view data) {
  DecodedValue value;
  for (const Field& field : parse_fields(data)) {
    if (field.number == 1) {
      EXPECT_EQ(field.wire_type, 2u);
      value.tag = field.bytes;
    } else if (field.number == 2) {
      EXPECT_EQ(field.wire_type, 5u);
      value.simple_value = std::bit_cast<float>(static_cast<uint32_t>(read_le(field.bytes, 0, 4)));
    } else if (field.number == 5) {
      EXPECT_EQ(field.wire_type, 2u);
      value.histo = decode_histogram(field.bytes);
    } else {
      ADD_FAILURE() << "unexpected Summary.Value field " << field.number;
    }
  }
  return value;
}

DecodedEvent decode_event(std::string_view data) {
  DecodedEvent event;
  for (const Field& field : parse_fields(data)) {
    if (field.number == 1) {
      event.wall_time = as_double(field);
    } else if (field.number == 2) {
      EXPECT_EQ(field.wire_type, 0u);
      event.step = static_cast<int64_t>(field.varint);
    } else if (field.number == 3) {
      EXPECT_EQ(field.wire_type, 2u);
      event.file_version = field.bytes;
    } else if (field.number == 5) {
      EXPECT_EQ(field.wire_type, 2u);
      for (const Field& summary_field : parse_fields(field.bytes)) {
        EXPECT_EQ(summary_field.number, 1u); // Summary.value
        event.values.push_back(decode_value(summary_field.bytes));
      }
    } else {
      ADD_FAILURE() << "unexpected Event field " << field.number;
    }
  }
  return event;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<DecodedEvent> decode_file(const fs::path& path) {
  std::vector<DecodedEvent> events;
  for (const std::string& payload : read_records(read_file(path))) {
    events.push_back(decode_event(payload));
  }
  return events;
}

// ---- the Python checker ------------------------------------------------------------------

constexpr const char* kPython = LARGO_PYTHON;

struct CommandResult {
  int exit_code = -1;
  std::string stdout_text;
};

CommandResult run_checker(const std::string& argument) {
  const std::string script =
      std::string(largo::test_paths::data_dir()) + "/reference/read_tfevents.py";
  const std::string command = std::string(kPython) + " '" + script + "' '" + argument + "'";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return result;
  }
  char buffer[4096];
  size_t num_read = 0;
  while ((num_read = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.stdout_text.append(buffer, num_read);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

#define SKIP_WITHOUT_PYTHON()                                                                      \
  if (access(kPython, X_OK) != 0) {                                                                \
    GTEST_SKIP() << kPython << " not found; the Python checker is skipped";                        \
  }

// A fresh directory per test, removed afterwards.
class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("largo_tb_") + info->name() + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}


// ---- wire helpers ------------------------------------------------------------------------

TEST(Crc32c, MatchesStandardTestVector) {
  EXPECT_EQ(wire::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(bitwise_crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(wire::crc32c(""), 0u);
  // 32 zero bytes: another published CRC32C vector (RFC 3720, B.4).
  EXPECT_EQ(wire::crc32c(std::string(32, '\0')), 0x8A9136AAu);
}

TEST(Crc32c, TableMatchesBitwiseOnRandomBytes) {
  std::mt19937 rng(7);
  for (int length = 0; length < 200; length += 13) {
    std::string bytes(length, '\0');
    for (char& c : bytes) {
      c = static_cast<char>(rng() & 0xFFu);
    }
    EXPECT_EQ(wire::crc32c(bytes), bitwise_crc32c(bytes)) << "length " << length;
    EXPECT_EQ(wire::masked_crc32c(bytes), bitwise_masked_crc32c(bytes)) << "length " << length;
  }
}

TEST(ProtobufWire, VarintsMatchTheProtobufSpec) {
  std::string out;
  wire::append_varint(out, 1);
  EXPECT_EQ(out, std::string("\x01", 1));
  out.clear();
  wire::append_varint(out, 300); // the example of the protobuf encoding guide
  EXPECT_EQ(out, "\xAC\x02");
  out.clear();
  wire::append_int64_field(out, 2, -1); // negative int64: ten bytes
  EXPECT_EQ(out, std::string("\x10\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x01", 11));
}

TEST(ProtobufWire, FixedWidthFieldsAreLittleEndian) {
  std::string out;
  wire::append_double_field(out, 1, 1.0);
  EXPECT_EQ(out, std::string("\x09\x00\x00\x00\x00\x00\x00\xF0\x3F", 9));
  out.clear();
  wire::append_float_field(out, 2, 1.0f);
  EXPECT_EQ(out, std::string("\x15\x00\x00\x80\x3F", 5));
  out.clear();
  wire::append_bytes_field(out, 1, "ab");
  EXPECT_EQ(
      out,
      "\x0A\x02"
      "ab");
  out.clear();
  const std::vector<double> values = {1.0, 2.0};
  wire::append_packed_doubles_field(out, 6, values);
  EXPECT_EQ(
      out,
      std::string(
          "\x32\x10\x00\x00\x00\x00\x00\x00\xF0\x3F"
          "\x00\x00\x00\x00\x00\x00\x00\x40",
          18));
}

TEST(ProtobufWire, TfRecordFraming) {
  std::string record;
  wire::append_tfrecord(record, "hello");
  ASSERT_EQ(record.size(), 8u + 4u + 5u + 4u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x05\x00\x00\x00\x00\x00\x00\x00", 8));
  EXPECT_EQ(read_le(record, 8, 4), bitwise_masked_crc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, 5), "hello");
  EXPECT_EQ(read_le(record, 17, 4), bitwise_masked_crc32c("hello"));
}

// ---- the writer --------------------------------------------------------------------------

TEST_F(TensorBoardWriterTest, CreatesANamedEventFileWithTheVersionRecord) {
  const double start_seconds = now_seconds();
  TensorBoardWriter writer(dir_ / "nested" / "tb_logs");
  const fs::path path = writer.file_path();
  EXPECT_EQ(path.parent_path(), dir_ / "nested" / "tb_logs");
  EXPECT_EQ(path.filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_NE(path.filename().string().find(host), std::string::npos) << path;

  // Readable before any flush(): the constructor makes the file visible to TensorBoard.
  const std::vector<DecodedEvent> events = decode_file(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  ASSERT_TRUE(events[0].wall_time.has_value());
  EXPECT_GE(*events[0].wall_time, start_seconds - 1.0);
  EXPECT_LE(*events[0].wall_time, now_seconds() + 1.0);
  EXPECT_FALSE(events[0].step.has_value());
}

TEST_F(TensorBoardWriterTest, ScalarsDecodeWithTagValueAndStep) {
  TensorBoardWriter writer(dir_);
  writer.add_scalar("train/loss", 2.5, 0);
  writer.add_scalar("train/lr", 0.1, 0);
  writer.add_scalar("train/loss", 1.25, 10);
  writer.add_scalar("test/top1", 97.5, int64_t{1} << 40); // a step beyond 32 bits
  writer.flush();

  const std::vector<DecodedEvent> events = decode_file(writer.file_path());
  ASSERT_EQ(events.size(), 5u);
  struct Expected {
    std::string tag;
    float value;
    int64_t step;
  };
  const std::vector<Expected> expected = {
      {"train/loss", 2.5f, 0},
      {"train/lr", 0.1f, 0},
      {"train/loss", 1.25f, 10},
      {"test/top1", 97.5f, int64_t{1} << 40}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const DecodedEvent& event = events[i + 1];
    ASSERT_EQ(event.values.size(), 1u);
    EXPECT_EQ(event.values[0].tag, expected[i].tag);
    ASSERT_TRUE(event.values[0].simple_value.has_value());
    EXPECT_EQ(*event.values[0].simple_value, expected[i].value); // exact: float round trip
    EXPECT_EQ(event.step, expected[i].step);
    EXPECT_TRUE(event.wall_time.has_value());
    EXPECT_FALSE(event.values[0].histo.has_value());
  }
}

TEST_F(TensorBoardWriterTest, DestructorFlushes) {
  fs::path path;
  {
    TensorBoardWriter writer(dir_);
    path = writer.file_path();
    writer.add_scalar("train/loss", 3.0, 7);
  }
  const std::vector<DecodedEvent> events = decode_file(path);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].step, 7);
  EXPECT_EQ(events[1].values.at(0).simple_value, 3.0f);
}

TEST_F(TensorBoardWriterTest, TwoWritersInOneDirectoryGetTwoFiles) {
  TensorBoardWriter first(dir_);
  TensorBoardWriter second(dir_);
  EXPECT_NE(first.file_path(), second.file_path());
  first.add_scalar("a", 1.0, 1);
  second.add_scalar("b", 2.0, 2);
  first.flush();
  second.flush();
  EXPECT_EQ(decode_file(first.file_path()).at(1).values.at(0).tag, "a");
  EXPECT_EQ(decode_file(second.file_path()).at(1).values.at(0).tag, "b");
}

TEST_F(TensorBoardWriterTest, HistogramStatisticsAndBuckets) {
  TensorBoardWriter writer(dir_);
  // [2, 6]: 0..9 plus a NaN and an inf, which are left out.
  auto values = torch::arange(12, torch::kFloat32).reshape({2, 6});
  values[1][4] = std::numeric_limits<float>::quiet_NaN();
  values[1][5] = std::numeric_limits<float>::infinity();
  writer.add_histogram("weights/fc", values, 3, /*num_bins=*/5);
  writer.add_histogram("constant", torch::full({4}, 2.0), 4);
  writer.add_histogram("empty", torch::empty({0}), 5);
  writer.flush();

  const std::vector<DecodedEvent> events = decode_file(writer.file_path());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[1].step, 3);
  ASSERT_EQ(events[1].values.size(), 1u);
  EXPECT_EQ(events[1].values[0].tag, "weights/fc");
  ASSERT_TRUE(events[1].values[0].histo.has_value());
  const DecodedHistogram& histo = *events[1].values[0].histo;
  EXPECT_EQ(histo.min, 0.0);
  EXPECT_EQ(histo.max, 9.0);
  EXPECT_EQ(histo.num, 10.0);
  EXPECT_EQ(histo.sum, 45.0);
  EXPECT_EQ(histo.sum_squares, 285.0);
  // Bins of width 1.8 over [0, 9]: {0,1} {2,3} {4,5} {6,7} {8,9}.
  ASSERT_EQ(histo.bucket_limit.size(), 5u);
  const std::vector<double> limits = {1.8, 3.6, 5.4, 7.2, 9.0};
  for (size_t i = 0; i < limits.size(); ++i) {
    EXPECT_NEAR(histo.bucket_limit[i], limits[i], 1e-12) << i;
  }
  EXPECT_EQ(histo.bucket, (std::vector<double>{2, 2, 2, 2, 2}));

  const DecodedHistogram& constant = events[2].values.at(0).histo.value();
  EXPECT_EQ(constant.num, 4.0);
  EXPECT_EQ(constant.min, 2.0);
  EXPECT_EQ(constant.max, 2.0);
  EXPECT_EQ(constant.bucket_limit, (std::vector<double>{2.0}));
  EXPECT_EQ(constant.bucket, (std::vector<double>{4.0}));

  const DecodedHistogram& empty = events[3].values.at(0).histo.value();
  EXPECT_EQ(empty.num, 0.0);
  EXPECT_EQ(empty.bucket, (std::vector<double>{0.0}));
}

TEST_F(TensorBoardWriterTest, RejectsBadArguments) {
  TensorBoardWriter writer(dir_);
  EXPECT_THROW(writer.add_scalar("", 1.0, 0), largo::Error);
  EXPECT_THROW(writer.add_histogram("h", torch::ones({3}), 0, /*num_bins=*/0), largo::Error);

  // A log directory that is in fact a file.
  const fs::path not_a_dir = dir_ / "file";
  std::ofstream(not_a_dir) << "x";
  EXPECT_THROW(TensorBoardWriter{not_a_dir / "tb_logs"}, largo::Error);
}

TEST_F(TensorBoardWriterTest, CorruptionIsDetected) {
  fs::path path;
  {
    TensorBoardWriter writer(dir_);
    path = writer.file_path();
    writer.add_scalar("train/loss", 1.0, 1);
  }
  std::string blob = read_file(path);
  ASSERT_NO_THROW(read_records(blob));
  blob[blob.size() - 6] ^= 0x01; // a byte of the last payload (the float value)
  std::ofstream(path, std::ios::binary | std::ios::trunc) << blob;
  EXPECT_THROW(read_records(read_file(path)), std::runtime_error);

  SKIP_WITHOUT_PYTHON();
  EXPECT_EQ(run_checker(path.string()).exit_code, 1) << "the Python checker missed a bad CRC";
}

// ---- cross-check with the independent Python reader --------------------------------------

TEST(TensorBoardPythonChecker, SelfTestPasses) {
  SKIP_WITHOUT_PYTHON();
  const CommandResult result = run_checker("--self-test");
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.stdout_text, "ok\n");
}

TEST_F(TensorBoardWriterTest, PythonCheckerReadsScalarsAndHistograms) {
  SKIP_WITHOUT_PYTHON();
  fs::path written;
  {
    TensorBoardWriter writer(dir_);
    written = writer.file_path();
    writer.add_scalar("train/loss", 0.6931471805599453, 1);
    writer.add_scalar("train/images_per_sec", 1234.5, 2);
    writer.add_scalar("train/lr", -0.25, -3); // negative values and steps survive too
    writer.add_histogram("weights", torch::tensor({-1.0, 0.0, 1.0, 3.0}), 4, /*num_bins=*/2);
  } // the destructor flushes

  const CommandResult result = run_checker(written.string());
  ASSERT_EQ(result.exit_code, 0) << result.stdout_text;
  const nlohmann::json events = nlohmann::json::parse(result.stdout_text);
  ASSERT_EQ(events.size(), 5u) << events.dump();
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  EXPECT_NEAR(events[0]["wall_time"].get<double>(), now_seconds(), 60.0);

  EXPECT_EQ(events[1]["step"], 1);
  EXPECT_EQ(events[1]["summary"][0]["tag"], "train/loss");
  EXPECT_EQ(
      events[1]["summary"][0]["simple_value"].get<double>(),
      static_cast<double>(static_cast<float>(0.6931471805599453)));
  EXPECT_EQ(events[2]["step"], 2);
  EXPECT_EQ(events[2]["summary"][0]["tag"], "train/images_per_sec");
  EXPECT_EQ(events[2]["summary"][0]["simple_value"].get<double>(), 1234.5);
  EXPECT_EQ(events[3]["step"], -3);
  EXPECT_EQ(events[3]["summary"][0]["simple_value"].get<double>(), -0.25);

  const nlohmann::json& histo = events[4]["summary"][0]["histo"];
  EXPECT_EQ(events[4]["summary"][0]["tag"], "weights");
  EXPECT_EQ(histo["min"], -1.0);
  EXPECT_EQ(histo["max"], 3.0);
  EXPECT_EQ(histo["num"], 4.0);
  EXPECT_EQ(histo["sum"], 3.0);
  EXPECT_EQ(histo["sum_squares"], 11.0);
  EXPECT_EQ(histo["bucket_limit"], (nlohmann::json{1.0, 3.0}));
  EXPECT_EQ(histo["bucket"], (nlohmann::json{2.0, 2.0}));
}

} // namespace
} // namespace tensorboard_writer_test
