// An 8-bit RGB image in memory: the unit the per-sample decode and transforms pass along.
// Pixels are interleaved (R, G, B per pixel, rows top to bottom), as PIL and libjpeg keep
// them; the batch the loader builds is planar ([channels, h, w]) and is written only once,
// at the end of a sample's pipeline.
#pragma once

#include <cstdint>
#include <vector>

namespace largo::data {

struct Image {
  static constexpr int64_t kChannels = 3;

  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels; // [height, width, 3]

  // Sets the size; keeps the allocation when it is large enough (buffers are reused per
  // thread). The pixel values are unspecified afterwards.
  void reshape(int64_t new_width, int64_t new_height) {
    width = new_width;
    height = new_height;
    pixels.resize(static_cast<size_t>(new_width * new_height * kChannels));
  }
  uint8_t* row(int64_t y) {
    return pixels.data() + y * width * kChannels;
  }
  const uint8_t* row(int64_t y) const {
    return pixels.data() + y * width * kChannels;
  }
};

// A rectangle of pixels: columns [x, x + width), rows [y, y + height).
struct PixelRegion {
  int64_t x = 0;
  int64_t y = 0;
  int64_t width = 0;
  int64_t height = 0;
};

} // namespace largo::data
