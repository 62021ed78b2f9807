#include "largo/data/binary_records.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "largo/core/error.h"

namespace largo::data {

at::Tensor read_binary_records(
    const std::filesystem::path& path, int64_t record_bytes, const std::string& format) {
  std::error_code error;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  if (error) {
    throw DataError(
        fmt::format("cannot read {} file {}: {}", format, path.string(), error.message()));
  }
  if (file_bytes % record_bytes != 0) {
    throw DataError(fmt::format(
        "{} file {} has {} bytes, not a multiple of the {}-byte record size "
        "({} whole records + {} bytes); the file is truncated or not the binary version, "
        "download it again",
        format,
        path.string(),
        file_bytes,
        record_bytes,
        file_bytes / record_bytes,
        file_bytes % record_bytes));
  }
  const int64_t num_records = file_bytes / record_bytes;
  at::Tensor records = at::empty({num_records, record_bytes}, at::kByte);
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw DataError(
        fmt::format("cannot open {} file {}: {}", format, path.string(), std::strerror(errno)));
  }
  const size_t got = std::fread(records.data_ptr(), 1, static_cast<size_t>(file_bytes), file);
  std::fclose(file);
  if (static_cast<int64_t>(got) != file_bytes) {
    throw DataError(
        fmt::format("{} file {}: read {} of {} bytes", format, path.string(), got, file_bytes));
  }
  return records;
}

} // namespace largo::data
