// The JPEG and PNG back ends of EncodedImage (image_decoder.h). Private to the data layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "largo/data/image.h"

namespace largo::data::detail {

struct ImageSize {
  int64_t width = 0;
  int64_t height = 0;
};

// Both throw DataError naming `name` for a corrupt or unsupported header.
ImageSize read_jpeg_size(const uint8_t* data, size_t size, const std::string& name);
ImageSize read_png_size(const uint8_t* data, size_t size, const std::string& name);

// `region` is in the pixel grid of the image scaled by 1/denominator and lies inside it
// (the caller checks). Both throw DataError naming `name` for truncated or corrupt data.
void decode_jpeg(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    const PixelRegion& region,
    int denominator,
    Image& out);
void decode_png(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    const PixelRegion& region,
    Image& out);

} // namespace largo::data::detail
