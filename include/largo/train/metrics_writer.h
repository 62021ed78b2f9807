// Appends training/test metrics to a JSON Lines file (metrics.jsonl): one JSON object per
// line, easy to read back with `jq`, pandas or nlohmann::json. Schema: docs/metrics.md.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace largo::train {

// Opens `jsonl_path` in append mode, so a resumed run continues the same file, and
// creates its parent directory if missing. Every write() ends with a flush, so a crash
// loses no line already written. Thread-compatible: one writer per file, one thread
// (in distributed runs only rank 0 creates one).
class MetricsWriter {
 public:
  // Throws largo::Error if the file cannot be opened for appending.
  explicit MetricsWriter(std::filesystem::path jsonl_path);

  // Appends `event` as one line. Throws largo::Error if `event` is not a JSON object or
  // the line cannot be written. Non-finite numbers are written as null (JSON has no NaN);
  // invalid UTF-8 in strings is replaced by U+FFFD rather than failing the run.
  void write(const nlohmann::json& event);

  const std::filesystem::path& path() const {
    return jsonl_path_;
  }

 private:
  std::filesystem::path jsonl_path_;
  std::ofstream file_;
};

} // namespace largo::train
