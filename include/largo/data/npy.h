// NumPy's .npy file format (versions 1.0, 2.0 and 3.0), read and written without NumPy.
// Reading serves VISSL's disk_filelist (an array of image paths and an array of labels);
// writing serves anything that hands arrays to Python (features, labels, path lists), which
// reads them back with np.load.
//
// Supported element types: strings ('<U' UTF-32 and '|S' bytes), booleans, signed and
// unsigned integers and floats of every width, in either byte order. Object arrays ('|O')
// are pickles and are rejected with an error that says how to save the array instead.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace largo::data {

// One array as stored in a .npy file.
struct NpyArray {
  // NumPy's dtype string, e.g. "<U12", "|S7", "<i8", "<f4", "|u1".
  std::string descr;
  std::vector<int64_t> shape;
  bool fortran_order = false;
  // The elements' bytes exactly as stored (descr's byte order; Fortran order if so flagged).
  std::vector<char> data;

  int64_t numel() const;
  // Bytes per element, from descr.
  int64_t item_size() const;
};

// Reads a .npy file. Throws DataError naming the file for a missing or unreadable file, a
// bad magic string or header, or a data section shorter or longer than the header says.
NpyArray read_npy(const std::filesystem::path& path);

// The elements of a 1-D string array ('<U' or '|S', trailing NULs removed, UTF-32 turned
// into UTF-8). Throws DataError naming `path` (used in messages only) for another dtype or
// more than one dimension.
std::vector<std::string> npy_strings(const NpyArray& array, const std::filesystem::path& path);

// The elements of a 1-D integer array (any width, signed or unsigned; also accepts a float
// array whose values are all whole numbers, which is how labels saved through a float list
// arrive). Throws DataError naming `path` otherwise.
std::vector<int64_t> npy_integers(const NpyArray& array, const std::filesystem::path& path);

// Writes an array as a version 1.0 .npy file (2.0 when the header needs it), atomically:
// a reader never sees a half-written file. `data` holds numel(shape) elements of `descr`'s
// type in C order. Throws DataError for a descr this module cannot size, largo::Error on
// I/O failure.
void write_npy(
    const std::filesystem::path& path,
    const std::string& descr,
    const std::vector<int64_t>& shape,
    const void* data,
    size_t num_bytes);

// A tensor (bool, uint8, int8/16/32/64, float16/32/64) as a little-endian .npy file of the
// same shape and dtype. Throws DataError for another dtype.
void write_npy(const std::filesystem::path& path, const at::Tensor& tensor);

// Strings as a 1-D '<U' array (UTF-8 in, UTF-32 in the file), the form
// np.save(path, np.array(list_of_str)) produces. Throws DataError for invalid UTF-8.
void write_npy_strings(const std::filesystem::path& path, const std::vector<std::string>& values);

} // namespace largo::data
