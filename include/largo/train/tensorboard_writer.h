// Writes TensorBoard event files (scalars and histograms) from C++ without TensorFlow or
// a protobuf library: each event is a hand-encoded tensorflow.Event in a TFRecord, the
// format `tensorboard --logdir` reads. See docs/tensorboard.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace largo::train {

// One writer owns one event file,
//   <log_dir>/events.out.tfevents.<unix_seconds>.<hostname>
// (a ".<n>" suffix is added if that name is taken, e.g. two writers in the same second).
// TensorBoard merges all event files of a directory, so a resumed run simply adds a file.
//
// Thread-compatible, not thread-safe: use one writer per process, from one thread (in
// distributed runs only rank 0 creates one). Records are buffered; they reach the file on
// flush(), on destruction, and on the first add_* call more than kAutoFlushInterval after
// the last flush, so a crashed run loses at most that much.
class TensorBoardWriter {
 public:
  static constexpr std::chrono::seconds kAutoFlushInterval{10};
  static constexpr int64_t kDefaultHistogramBins = 30;

  // Creates `log_dir` (and parents) if missing and writes the file-version record.
  // Throws largo::Error if the directory or file cannot be created.
  explicit TensorBoardWriter(const std::filesystem::path& log_dir);
  // Flushes, but cannot report a failure: call flush() first to learn about one.
  ~TensorBoardWriter();

  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One point of the curve `tag` (e.g. "train/loss") at x = `step`. TensorBoard stores
  // scalars as float32, so `value` is rounded to float.
  void add_scalar(const std::string& tag, double value, int64_t step);

  // The distribution of `values` (any shape, dtype and device; it is copied to CPU as
  // double) in `num_bins` equal-width bins between its min and max. Non-finite elements
  // are left out. A tensor with no finite element is written as an empty histogram
  // (num = 0, one bucket of count 0 at limit 0).
  void add_histogram(
      const std::string& tag,
      const at::Tensor& values,
      int64_t step,
      int64_t num_bins = kDefaultHistogramBins);

  // Hands every buffered record to the operating system.
  void flush();

  // The event file this writer appends to.
  const std::filesystem::path& file_path() const {
    return file_path_;
  }

 private:
  void write_event(const std::string& event_payload);

  std::filesystem::path file_path_;
  std::ofstream file_;
  std::chrono::steady_clock::time_point last_flush_;
};

} // namespace largo::train
