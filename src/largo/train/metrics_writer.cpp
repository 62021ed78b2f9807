// JSON Lines metrics writer; see metrics_writer.h.
#include "largo/train/metrics_writer.h"

#include "largo/core/error.h"

#include <fmt/format.h>

#include <system_error>
#include <utility>

namespace largo::train {

MetricsWriter::MetricsWriter(std::filesystem::path jsonl_path)
    : jsonl_path_(std::move(jsonl_path)) {
  if (jsonl_path_.has_parent_path()) {
    std::error_code error;
    std::filesystem::create_directories(jsonl_path_.parent_path(), error);
    if (error) {
      throw Error(fmt::format(
          "MetricsWriter: cannot create directory '{}': {}; check the path and its permissions",
          jsonl_path_.parent_path().string(),
          error.message()));
    }
  }
  file_.open(jsonl_path_, std::ios::out | std::ios::app);
  if (!file_) {
    throw Error(fmt::format(
        "MetricsWriter: cannot open '{}' for appending; check the path and its permissions",
        jsonl_path_.string()));
  }
}

void MetricsWriter::write(const nlohmann::json& event) {
  if (!event.is_object()) {
    throw Error(fmt::format(
        "MetricsWriter: each metrics line must be a JSON object, got a {} ({})",
        event.type_name(),
        event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  }
  // indent = -1 keeps the object on one line, whatever strings it holds ("\n" is escaped).
  file_ << event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  file_.flush();
  if (!file_) {
    throw Error(fmt::format(
        "MetricsWriter: cannot write to '{}' (disk full or file removed?)", jsonl_path_.string()));
  }
}

} // namespace largo::train
