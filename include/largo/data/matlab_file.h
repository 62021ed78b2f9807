// Numeric arrays of a MATLAB Level 5 MAT-file (MATLAB's -v6 and -v7 formats, what
// scipy.io.savemat writes; https://www.mathworks.com/help/pdf_doc/matlab/matfile_format.pdf):
// a 128-byte header, then one data element per variable, each a miMATRIX (array flags with the
// class, dimensions, name, real part), possibly zlib-compressed (miCOMPRESSED, -v7's default).
// The real part may be stored in a smaller type than the class (MATLAB does that for doubles
// holding small integers); it is read as the class. Only what SVHN's files hold is read:
// little-endian files and real, non-sparse numeric arrays.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace largo::data {

struct MatlabArray {
  std::vector<int64_t> dims; // MATLAB's dimensions, column-major (the first varies fastest)
  // The values in storage order (column-major), flat, in the class's dtype (uint8 for
  // uint8, float64 for double, ...).
  at::Tensor values;
};

// The variables named `names` of the file at `path`. Throws DataError naming the file for a
// file that is not a Level 5 MAT-file (a -v7.3 HDF5 one included), big-endian, truncated or
// corrupt, a named variable that is missing, or one that is not a real numeric array.
std::map<std::string, MatlabArray> read_matlab_arrays(
    const std::filesystem::path& path, const std::vector<std::string>& names);

} // namespace largo::data
