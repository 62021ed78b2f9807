// Helpers for the WebDataset tests: a minimal ustar writer (what webdataset's TarWriter and
// scripts/pack_webdataset.py write for short names) and shards of small labelled images.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "data/image_test_util.h"
#include "largo/core/error.h"

namespace largo::data::testing {

struct TarEntry {
  std::string name;
  std::vector<uint8_t> data;
  char type = '0';
};

// One ustar header block for `name` (< 100 bytes) with `size` bytes of data.
inline std::vector<uint8_t> ustar_header(const std::string& name, int64_t size, char type = '0') {
  std::vector<uint8_t> block(512, 0);
  std::memcpy(block.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(reinterpret_cast<char*>(&block[100]), 8, "%07o", 0644);
  std::snprintf(reinterpret_cast<char*>(&block[108]), 8, "%07o", 0);
  std::snprintf(reinterpret_cast<char*>(&block[116]), 8, "%07o", 0);
  std::snprintf(
      reinterpret_cast<char*>(&block[124]), 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(reinterpret_cast<char*>(&block[136]), 12, "%011o", 0);
  block[156] = static_cast<uint8_t>(type);
  std::memcpy(
      &block[257],
      "ustar\0"
      "00",
      8);
  std::memset(&block[148], ' ', 8);
  unsigned sum = 0;
  for (uint8_t b : block) {
    sum += b;
  }
  std::snprintf(reinterpret_cast<char*>(&block[148]), 8, "%06o", sum);
  block[155] = ' ';
  return block;
}

// The bytes of a tar archive holding `entries`, ended by two zero blocks.
inline std::vector<uint8_t> tar_bytes(const std::vector<TarEntry>& entries) {
  std::vector<uint8_t> out;
  for (const TarEntry& entry : entries) {
    const std::vector<uint8_t> header =
        ustar_header(entry.name, static_cast<int64_t>(entry.data.size()), entry.type);
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), entry.data.begin(), entry.data.end());
    out.resize((out.size() + 511) / 512 * 512, 0);
  }
  out.resize(out.size() + 1024, 0);
  return out;
}

inline void write_tar(const std::filesystem::path& path, const std::vector<TarEntry>& entries) {
  write_bytes(path, tar_bytes(entries));
}

inline std::vector<uint8_t> text_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// A small PNG that differs per seed.
inline std::vector<uint8_t> tiny_png(int seed, int64_t side = 8) {
  return encode_png(pattern_image(side, side, seed));
}

// A WebDataset sample: key.png + key.cls.
inline std::vector<TarEntry> sample_entries(const std::string& key, int64_t label, int seed) {
  return {{key + ".png", tiny_png(seed)}, {key + ".cls", text_bytes(std::to_string(label))}};
}

// `num_shards` shards shard-000000.tar ... of `per_shard` samples each under `dir`; sample
// n (counting over the shards in order) has label n, so a label names its sample.
inline void write_labelled_shards(const std::filesystem::path& dir, int num_shards, int per_shard) {
  std::filesystem::create_directories(dir);
  int n = 0;
  for (int j = 0; j < num_shards; ++j) {
    std::vector<TarEntry> entries;
    for (int k = 0; k < per_shard; ++k, ++n) {
      const auto sample = sample_entries(fmt::format("s{}", n), n, n);
      entries.insert(entries.end(), sample.begin(), sample.end());
    }
    write_tar(dir / fmt::format("shard-{:06d}.tar", j), entries);
  }
}

// The message of the DataError `call` throws, or "(no error)".
inline std::string data_error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const DataError& error) {
    return error.what();
  }
  return "(no error)";
}

} // namespace largo::data::testing
