// TensorBoard event-file writer; see tensorboard_writer.h for the contract and
// protobuf_wire.h for the encoding. Field numbers are those of tensorflow/core/util/
// event.proto and tensorflow/core/framework/summary.proto.
#include "largo/train/tensorboard_writer.h"

#include "largo/core/error.h"
#include "protobuf_wire.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <system_error>
#include <vector>

namespace largo::train {
namespace {

// tensorflow.Event
constexpr uint32_t kEventWallTime = 1;    // double, seconds since the Unix epoch
constexpr uint32_t kEventStep = 2;        // int64
constexpr uint32_t kEventFileVersion = 3; // string, first record only
constexpr uint32_t kEventSummary = 5;     // Summary
// tensorflow.Summary
constexpr uint32_t kSummaryValue = 1; // repeated Summary.Value
// tensorflow.Summary.Value
constexpr uint32_t kValueTag = 1;         // string
constexpr uint32_t kValueSimpleValue = 2; // float
constexpr uint32_t kValueHisto = 5;       // HistogramProto
// tensorflow.HistogramProto
constexpr uint32_t kHistoMin = 1;
constexpr uint32_t kHistoMax = 2;
constexpr uint32_t kHistoNum = 3;
constexpr uint32_t kHistoSum = 4;
constexpr uint32_t kHistoSumSquares = 5;
constexpr uint32_t kHistoBucketLimit = 6; // packed doubles: upper edge of each bucket
constexpr uint32_t kHistoBucket = 7;      // packed doubles: count in (previous limit, limit]

// TensorBoard's loaders check this exact string to accept the file.
constexpr std::string_view kFileVersion = "brain.Event:2";

double wall_time_seconds() {
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration<double>(since_epoch).count();
}

std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0 || buffer[0] == '\0') {
    return "localhost";
  }
  return buffer;
}

// An Event with wall_time and step set, plus `summary_value` (a serialized
// Summary.Value) wrapped in a Summary.
std::string summary_event(int64_t step, const std::string& summary_value) {
  std::string summary;
  wire::append_bytes_field(summary, kSummaryValue, summary_value);
  std::string event;
  wire::append_double_field(event, kEventWallTime, wall_time_seconds());
  wire::append_int64_field(event, kEventStep, step);
  wire::append_bytes_field(event, kEventSummary, summary);
  return event;
}

[[noreturn]] void throw_write_error(const std::filesystem::path& file_path) {
  throw Error(fmt::format(
      "TensorBoardWriter: cannot write to '{}' (disk full or file removed?)", file_path.string()));
}

void check_tag(const std::string& tag) {
  if (tag.empty()) {
    throw Error("TensorBoardWriter: empty tag; name the curve, e.g. \"train/loss\"");
  }
}

} // namespace

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& log_dir) {
  std::error_code error;
  std::filesystem::create_directories(log_dir, error);
  if (error) {
    throw Error(fmt::format(
        "TensorBoardWriter: cannot create log directory '{}': {}; check the path and its "
        "permissions",
        log_dir.string(),
        error.message()));
  }
  const auto unix_seconds = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  const std::string base_name = fmt::format("events.out.tfevents.{}.{}", unix_seconds, host_name());
  file_path_ = log_dir / base_name;
  // Never overwrite another writer's file (e.g. a second writer started in the same second).
  for (int suffix = 1; std::filesystem::exists(file_path_); ++suffix) {
    file_path_ = log_dir / fmt::format("{}.{}", base_name, suffix);
  }
  file_.open(file_path_, std::ios::binary | std::ios::out | std::ios::trunc);
  if (!file_) {
    throw Error(fmt::format(
        "TensorBoardWriter: cannot open '{}' for writing; check the permissions of the log "
        "directory",
        file_path_.string()));
  }

  std::string event;
  wire::append_double_field(event, kEventWallTime, wall_time_seconds());
  wire::append_bytes_field(event, kEventFileVersion, kFileVersion);
  write_event(event);
  // Make the file visible to a running TensorBoard right away.
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  // Destructors must not throw: a failed final write goes unreported here, which is why
  // the header asks callers who care to flush() first.
  file_.flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  check_tag(tag);
  std::string summary_value;
  wire::append_bytes_field(summary_value, kValueTag, tag);
  wire::append_float_field(summary_value, kValueSimpleValue, static_cast<float>(value));
  write_event(summary_event(step, summary_value));
}

void TensorBoardWriter::add_histogram(
    const std::string& tag, const at::Tensor& values, int64_t step, int64_t num_bins) {
  check_tag(tag);
  if (num_bins < 1) {
    throw Error(fmt::format(
        "TensorBoardWriter::add_histogram('{}'): num_bins = {}, expected at least 1",
        tag,
        num_bins));
  }
  const at::Tensor flat = values.detach().to(at::kCPU, at::kDouble).contiguous().flatten();
  const at::Tensor finite = flat.masked_select(at::isfinite(flat)); // [num_finite]
  const auto data = finite.accessor<double, 1>();
  const int64_t num = finite.numel();

  double min = 0.0;
  double max = 0.0;
  double sum = 0.0;
  double sum_squares = 0.0;
  std::vector<double> bucket_limits;
  std::vector<double> bucket_counts;
  if (num == 0) {
    bucket_limits = {0.0};
    bucket_counts = {0.0};
  } else {
    min = std::numeric_limits<double>::infinity();
    max = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < num; ++i) {
      min = std::min(min, data[i]);
      max = std::max(max, data[i]);
      sum += data[i];
      sum_squares += data[i] * data[i];
    }
    if (min == max) {
      // All values equal: one bucket ending at that value holds them all.
      bucket_limits = {max};
      bucket_counts = {static_cast<double>(num)};
    } else {
      const double bin_width = (max - min) / static_cast<double>(num_bins);
      bucket_counts.assign(num_bins, 0.0);
      for (int64_t i = 0; i < num; ++i) {
        // The maximum itself belongs to the last bin, not one past it.
        const auto bin =
            std::min<int64_t>(static_cast<int64_t>((data[i] - min) / bin_width), num_bins - 1);
        bucket_counts[bin] += 1.0;
      }
      bucket_limits.resize(num_bins);
      for (int64_t bin = 0; bin < num_bins; ++bin) {
        bucket_limits[bin] = min + bin_width * static_cast<double>(bin + 1);
      }
      bucket_limits.back() = max; // exact, whatever the rounding of the sum above
    }
  }

  std::string histogram;
  wire::append_double_field(histogram, kHistoMin, min);
  wire::append_double_field(histogram, kHistoMax, max);
  wire::append_double_field(histogram, kHistoNum, static_cast<double>(num));
  wire::append_double_field(histogram, kHistoSum, sum);
  wire::append_double_field(histogram, kHistoSumSquares, sum_squares);
  wire::append_packed_doubles_field(histogram, kHistoBucketLimit, bucket_limits);
  wire::append_packed_doubles_field(histogram, kHistoBucket, bucket_counts);

  std::string summary_value;
  wire::append_bytes_field(summary_value, kValueTag, tag);
  wire::append_bytes_field(summary_value, kValueHisto, histogram);
  write_event(summary_event(step, summary_value));
}

void TensorBoardWriter::flush() {
  file_.flush();
  last_flush_ = std::chrono::steady_clock::now();
  if (!file_) {
    throw_write_error(file_path_);
  }
}

void TensorBoardWriter::write_event(const std::string& event_payload) {
  std::string record;
  wire::append_tfrecord(record, event_payload);
  file_.write(record.data(), static_cast<std::streamsize>(record.size()));
  if (!file_) {
    throw_write_error(file_path_);
  }
  if (std::chrono::steady_clock::now() - last_flush_ >= kAutoFlushInterval) {
    flush();
  }
}

} // namespace largo::train
