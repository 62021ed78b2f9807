// Image resizing that reproduces PIL's Image.resize (Pillow 9, the path torchvision's
// Resize, RandomResizedCrop and CenterCrop take on PIL images) bit for bit:
//   - separable filters (box, bilinear, hamming, bicubic, lanczos) widened by the
//     downscale factor, i.e. antialiased; weights computed in double, normalised, then
//     rounded to 22-bit fixed point; horizontal pass first, each pass rounded and clipped
//     to 8 bits;
//   - nearest: PIL's affine nearest-neighbour mapping (source x = int((x + 0.5) * scale)
//     accumulated in double as PIL accumulates it).
// Only a window of the output can be computed: every output pixel depends on its own taps
// alone, so a window equals the same pixels cut from the full resize. That is what lets a
// crop after a resize (CenterCrop) decode and filter only what it keeps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "largo/data/image.h"

namespace largo::data {

// torchvision's InterpolationMode; the numbers are PIL's filter codes, which torchvision
// also accepts.
enum class Interpolation {
  kNearest = 0,
  kLanczos = 1,
  kBilinear = 2,
  kBicubic = 3,
  kBox = 4,
  kHamming = 5
};

// "nearest", "bilinear", "bicubic", "box", "hamming", "lanczos" (any case, also
// InterpolationMode.BILINEAR) or PIL's code "0".."5". Throws ConfigError otherwise.
Interpolation parse_interpolation(const std::string& name);
std::string to_string(Interpolation interpolation);

// The taps of one axis: output pixels [out_begin, out_end) of an `out_size` resize of the
// input span [in0, in1) of an input axis `in_size` pixels long (PIL's box; pixels outside
// [0, in_size) are never read).
class ResampleAxis {
 public:
  ResampleAxis(
      int64_t in_size,
      double in0,
      double in1,
      int64_t out_size,
      int64_t out_begin,
      int64_t out_end,
      Interpolation interpolation);

  // The input pixels the window reads: [input_begin(), input_end()).
  int64_t input_begin() const;
  int64_t input_end() const;
  int64_t output_size() const; // out_end - out_begin
  // Whether PIL skips this pass (same size, whole axis): the pixels pass through.
  bool identity() const;

  // Output pixel i of the window reads input pixels first(i) .. first(i) + count(i) - 1.
  int64_t first(int64_t i) const;
  int64_t count(int64_t i) const;
  const int32_t* weights(int64_t i) const; // count(i) weights, 22-bit fixed point

 private:
  bool identity_ = false;
  int64_t kernel_size_ = 1;
  std::vector<int64_t> first_;
  std::vector<int64_t> count_;
  std::vector<int32_t> weights_; // [output_size, kernel_size]
  int64_t input_begin_ = 0;
  int64_t input_end_ = 0;
};

// Resizes with PIL's two passes. `src` holds the input pixels columns
// [x_axis.input_begin(), x_axis.input_end()) x rows [y_axis.input_begin(), input_end())
// (pixel (0, 0) of src is input pixel (input_begin, input_begin)); `out` receives the
// window, x_axis.output_size() x y_axis.output_size().
void resample(const Image& src, const ResampleAxis& x_axis, const ResampleAxis& y_axis, Image& out);

} // namespace largo::data
