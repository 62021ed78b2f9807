// Helpers shared by the tests that read damaged checkpoints (checkpoint, train, apps suites).
#pragma once

#include <largo/checkpoint/zip_archive.h>
#include <largo/core/error.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace largo::testing {

// Runs `fn` and returns the CheckpointError's message; fails the test if nothing is thrown.
template <typename Fn>
std::string checkpoint_error(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}

// Flips the bits of `mask` in byte `offset` of the zip entry `entry` (e.g. "archive/data/0")
// of `file`, in place: damage the entry's CRC-32 check must catch.
inline void flip_bits_in_entry(
    const std::filesystem::path& file,
    const std::string& entry,
    uint64_t offset,
    char mask = 0x10) {
  uint64_t at = 0;
  {
    checkpoint::ZipArchive archive(file);
    const checkpoint::ZipArchive::Entry* found = archive.find(entry);
    ASSERT_NE(found, nullptr) << file << " has no entry " << entry;
    at = found->data_offset + offset;
  }
  std::fstream out(file, std::ios::in | std::ios::out | std::ios::binary);
  out.seekg(static_cast<std::streamoff>(at));
  const char byte = static_cast<char>(out.get());
  out.seekp(static_cast<std::streamoff>(at));
  out.put(static_cast<char>(byte ^ mask));
}

} // namespace largo::testing
