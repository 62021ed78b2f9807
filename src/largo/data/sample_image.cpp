// The lazy geometry of one sample and its materialisation (see sample_image.h).
#include "largo/data/sample_image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "largo/core/error.h"

namespace largo::data {
namespace {

// Copies `region` of `src` into `out`.
void copy_region(const Image& src, const PixelRegion& region, Image& out) {
  out.reshape(region.width, region.height);
  for (int64_t y = 0; y < region.height; ++y) {
    std::memcpy(
        out.row(y),
        src.row(region.y + y) + region.x * Image::kChannels,
        static_cast<size_t>(region.width * Image::kChannels));
  }
}

// Writes `valid` into `out` (width x height, zeros elsewhere) at (x, y), mirrored
// left-right over the whole of `out` when `flip`.
void place(
    const Image& valid,
    int64_t x,
    int64_t y,
    bool flip,
    int64_t width,
    int64_t height,
    Image& out) {
  out.reshape(width, height);
  std::fill(out.pixels.begin(), out.pixels.end(), uint8_t{0});
  for (int64_t row = 0; row < valid.height; ++row) {
    const uint8_t* src = valid.row(row);
    uint8_t* dst = out.row(y + row);
    if (!flip) {
      std::memcpy(
          dst + x * Image::kChannels, src, static_cast<size_t>(valid.width * Image::kChannels));
      continue;
    }
    for (int64_t column = 0; column < valid.width; ++column) {
      const int64_t target = width - 1 - (x + column);
      std::memcpy(
          dst + target * Image::kChannels, src + column * Image::kChannels, Image::kChannels);
    }
  }
}

} // namespace

SampleImage::SampleImage(const EncodedImage& encoded, const DecodeOptions& options)
    : encoded_(&encoded),
      name_(&encoded.name()),
      options_(options),
      source_width_(encoded.width()),
      source_height_(encoded.height()) {
  reset_geometry(source_width_, source_height_);
}

SampleImage::SampleImage(const Image& pixels, const std::string& name)
    : encoded_(nullptr),
      name_(&name),
      decoded_(true),
      borrowed_(&pixels),
      source_width_(pixels.width),
      source_height_(pixels.height) {
  reset_geometry(source_width_, source_height_);
}

SampleImage SampleImage::view_of(SampleImage& base) {
  SampleImage view(base.pixels(), *base.name_); // borrowed: a copy would copy the pixels
  view.encoded_ = base.encoded_;
  view.options_ = base.options_;
  return view;
}

void SampleImage::reset_geometry(int64_t width, int64_t height) {
  box_ = PixelRegion{0, 0, width, height};
  resize_width_ = width;
  resize_height_ = height;
  window_ = PixelRegion{0, 0, width, height};
}

bool SampleImage::has_resize() const {
  return resize_width_ != box_.width || resize_height_ != box_.height;
}

int64_t SampleImage::width() const {
  return window_.width;
}

int64_t SampleImage::height() const {
  return window_.height;
}

int SampleImage::last_scale_denominator() const {
  return last_denominator_;
}

void SampleImage::crop(int64_t top, int64_t left, int64_t height, int64_t width) {
  if (height <= 0 || width <= 0) {
    throw DataError(fmt::format("{}: crop of {}x{} pixels is empty", *name_, width, height));
  }
  if (flip_) {
    left = window_.width - left - width; // the same pixels, in unmirrored coordinates
  }
  const PixelRegion window{window_.x + left, window_.y + top, width, height};
  const bool inside = window.x >= 0 && window.y >= 0 && window.x + width <= resize_width_ &&
                      window.y + height <= resize_height_;
  if (!has_resize() && inside) {
    // No resize pending: the crop narrows the box itself, so a later resize sees only it.
    box_ = PixelRegion{box_.x + window.x, box_.y + window.y, width, height};
    resize_width_ = width;
    resize_height_ = height;
    window_ = PixelRegion{0, 0, width, height};
    return;
  }
  window_ = window;
}

void SampleImage::resize(int64_t height, int64_t width, Interpolation interpolation) {
  if (height <= 0 || width <= 0) {
    throw DataError(fmt::format("{}: resize to {}x{} pixels is empty", *name_, width, height));
  }
  if (height == window_.height && width == window_.width) {
    return; // PIL and torchvision return the image unchanged
  }
  const bool whole_box = window_.x == 0 && window_.y == 0 && window_.width == box_.width &&
                         window_.height == box_.height;
  if (has_resize() || !whole_box || flip_) {
    materialize(/*apply_flip=*/true);
  }
  resize_width_ = width;
  resize_height_ = height;
  interpolation_ = interpolation;
  window_ = PixelRegion{0, 0, width, height};
}

void SampleImage::hflip() {
  flip_ = !flip_;
}

bool SampleImage::geometry_pending() const {
  // A borrowed source is materialised (copied) before anything changes it in place.
  return !decoded_ || borrowed_ != nullptr || has_resize() || box_.x != 0 || box_.y != 0 ||
         box_.width != source_width_ || box_.height != source_height_ || window_.x != 0 ||
         window_.y != 0 || window_.width != box_.width || window_.height != box_.height;
}

Image& SampleImage::pixels() {
  if (geometry_pending() || flip_) {
    materialize(/*apply_flip=*/true);
  }
  return pixels_;
}

int SampleImage::scale_denominator() const {
  if (decoded_ || !options_.dct_scaling || !encoded_->supports_scaled_decoding()) {
    return 1;
  }
  for (const int d : {8, 4, 2}) {
    if (box_.width >= resize_width_ * d && box_.height >= resize_height_ * d) {
      return d;
    }
  }
  return 1;
}

void SampleImage::read_source(const PixelRegion& region, int denominator, Image& out) {
  if (decoded_) {
    copy_region(borrowed_ != nullptr ? *borrowed_ : pixels_, region, out);
    return;
  }
  encoded_->decode(region, denominator, out);
  last_denominator_ = denominator;
}

// One axis of the resize: the box [begin, begin + length) of a source axis `extent` pixels
// long, seen at 1/denominator scale, resized to `out_size`, of which [out0, out1) is wanted.
// Returns the taps and sets *grid0 to the scaled source pixel the taps count from.
ResampleAxis SampleImage::axis(
    int64_t begin,
    int64_t length,
    int64_t extent,
    int denominator,
    int64_t out_size,
    int64_t out0,
    int64_t out1,
    int64_t* grid0) const {
  const double d = denominator;
  const double box0 = static_cast<double>(begin) / d;
  const double box1 = static_cast<double>(begin + length) / d;
  // The whole scaled pixels covering the box (all of them when not scaled).
  *grid0 = static_cast<int64_t>(std::floor(box0));
  const int64_t grid1 = std::min(
      static_cast<int64_t>(std::ceil(box1)), EncodedImage::scaled_extent(extent, denominator));
  const auto size = static_cast<double>(grid1 - *grid0);
  return ResampleAxis(
      grid1 - *grid0,
      box0 - static_cast<double>(*grid0),
      std::min(box1 - static_cast<double>(*grid0), size),
      out_size,
      out0,
      out1,
      interpolation_);
}

void SampleImage::resample_window(const PixelRegion& wanted, Image& out) {
  thread_local Image source; // the source pixels the taps read
  const int denominator = scale_denominator();
  int64_t grid_x = 0;
  int64_t grid_y = 0;
  const ResampleAxis x_axis = axis(
      box_.x,
      box_.width,
      source_width_,
      denominator,
      resize_width_,
      wanted.x,
      wanted.x + wanted.width,
      &grid_x);
  const ResampleAxis y_axis = axis(
      box_.y,
      box_.height,
      source_height_,
      denominator,
      resize_height_,
      wanted.y,
      wanted.y + wanted.height,
      &grid_y);
  const PixelRegion region{
      grid_x + x_axis.input_begin(),
      grid_y + y_axis.input_begin(),
      x_axis.input_end() - x_axis.input_begin(),
      y_axis.input_end() - y_axis.input_begin()};
  read_source(region, denominator, source);
  resample(source, x_axis, y_axis, out);
}

void SampleImage::materialize(bool apply_flip) {
  thread_local Image valid; // the part of the window inside the resized box
  // The part of the window that lies on the resized box; the rest is zero padding.
  const int64_t x0 = std::max<int64_t>(window_.x, 0);
  const int64_t x1 = std::min(window_.x + window_.width, resize_width_);
  const int64_t y0 = std::max<int64_t>(window_.y, 0);
  const int64_t y1 = std::min(window_.y + window_.height, resize_height_);
  valid.reshape(0, 0);
  if (x0 < x1 && y0 < y1) {
    const PixelRegion wanted{x0, y0, x1 - x0, y1 - y0};
    if (has_resize()) {
      resample_window(wanted, valid);
    } else {
      read_source(PixelRegion{box_.x + x0, box_.y + y0, wanted.width, wanted.height}, 1, valid);
    }
  }
  const bool flip = apply_flip && flip_;
  if (!flip && valid.width == window_.width && valid.height == window_.height) {
    std::swap(pixels_, valid);
  } else {
    place(valid, x0 - window_.x, y0 - window_.y, flip, window_.width, window_.height, pixels_);
  }
  decoded_ = true;
  borrowed_ = nullptr;
  source_width_ = window_.width;
  source_height_ = window_.height;
  reset_geometry(source_width_, source_height_);
  if (flip) {
    flip_ = false;
  }
}

void SampleImage::write_planar(uint8_t* out) {
  if (geometry_pending()) {
    materialize(/*apply_flip=*/false); // the flip is folded into the copy below
  }
  const bool flip = flip_;
  const int64_t width = pixels_.width;
  const int64_t height = pixels_.height;
  const int64_t plane = width * height;
  for (int64_t y = 0; y < height; ++y) {
    const uint8_t* src = pixels_.row(y);
    uint8_t* r = out + y * width;
    uint8_t* g = r + plane;
    uint8_t* b = g + plane;
    for (int64_t x = 0; x < width; ++x) {
      const int64_t target = flip ? width - 1 - x : x;
      r[target] = src[3 * x];
      g[target] = src[3 * x + 1];
      b[target] = src[3 * x + 2];
    }
  }
}

} // namespace largo::data
