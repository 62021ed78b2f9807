// Files of fixed-size records with no header (the binary CIFAR and STL-10 files): read whole
// into one byte tensor, so that a dataset splits its label and image columns with tensor ops.
#pragma once

#include <filesystem>
#include <string>

#include <ATen/ATen.h>

namespace largo::data {

// The file at `path` as [records, record_bytes] uint8. Throws DataError naming the file, and
// `format` (e.g. "CIFAR-10"), when it cannot be read or its size is not a whole number of
// records (a truncated download, or another version of the dataset).
at::Tensor read_binary_records(
    const std::filesystem::path& path, int64_t record_bytes, const std::string& format);

} // namespace largo::data
