// One sample while its per-sample transforms run: an image that stays encoded as long as
// the transforms only ask for geometry, so that decoding happens once, at the end, and
// reads only what the output keeps.
//
// The pending geometry is "cut `box` from the source, resize it to resize_width x
// resize_height, take `window` of the result (zeros where the window leaves it), mirror
// it if `flip`". Crops and flips always compose into it exactly; a resize composes when
// nothing but a crop came before it (the torchvision order crop -> resize, as in
// RandomResizedCrop, or resize -> crop, as in Resize + CenterCrop). Anything else -- a
// second resize, a resize of a padded or flipped image, or a colour transform -- first
// materialises the pending geometry into pixels, exactly as torchvision's step-by-step
// PIL calls would have produced them, and continues from there.
//
// Materialising decodes only the source rows and columns the output's resampling taps read,
// at 1/2, 1/4 or 1/8 scale (JPEG DCT scaling) when the box is at least that many times
// larger than the resize target in both directions and DecodeOptions::dct_scaling is on.
#pragma once

#include <cstdint>
#include <string>

#include "largo/data/image.h"
#include "largo/data/image_decoder.h"
#include "largo/data/resample.h"

namespace largo::data {

class SampleImage {
 public:
  // Starts from an encoded image (not decoded yet). `encoded` must outlive this object.
  SampleImage(const EncodedImage& encoded, const DecodeOptions& options);
  // Starts from decoded pixels, read in place (an in-memory dataset's image, as torchvision
  // hands a PIL image of the stored array to the transforms). `pixels` and `name` (what
  // errors call the image) must outlive this object and stay unchanged while it does.
  SampleImage(const Image& pixels, const std::string& name);

  // A new sample that starts from `base`'s current pixels (base is materialised first),
  // reading them in place rather than copying: the views of a multi-crop pipeline
  // (multi_view_pipeline.h) each crop one full decode. `base` must outlive the view and
  // stay unchanged while it does.
  static SampleImage view_of(SampleImage& base);

  // The size the transforms see now (after the pending geometry).
  int64_t width() const;
  int64_t height() const;

  // torchvision's F.crop: rows [top, top + height), columns [left, left + width) of the
  // current image; parts outside it are zeros (as PIL's crop fills them).
  void crop(int64_t top, int64_t left, int64_t height, int64_t width);
  // torchvision's F.resize to exactly height x width with PIL's filters (resample.h).
  void resize(int64_t height, int64_t width, Interpolation interpolation);
  // torchvision's F.hflip.
  void hflip();

  // The current pixels, decoded and with the pending geometry applied; colour transforms
  // change them in place.
  Image& pixels();

  // Writes the current image as planar uint8 [3, height(), width()] at `out`.
  void write_planar(uint8_t* out);

  // The JPEG scale denominator the decode used (1 when none ran or not scaled); for tests
  // and measurements.
  int last_scale_denominator() const;

 private:
  // Applies the pending geometry (and the flip, if apply_flip) to the pixels.
  void materialize(bool apply_flip);
  bool geometry_pending() const; // anything but a flip
  // The pending resize of the box, computed for `wanted` (in resized coordinates) only.
  void resample_window(const PixelRegion& wanted, Image& out);
  ResampleAxis axis(
      int64_t begin,
      int64_t length,
      int64_t extent,
      int denominator,
      int64_t out_size,
      int64_t out0,
      int64_t out1,
      int64_t* grid0) const;
  // DCT scaling: the largest of 8, 4, 2 the box exceeds its resize by in both directions.
  int scale_denominator() const;
  // `region` of the source: decoded (at 1/denominator) or copied from the pixels.
  void read_source(const PixelRegion& region, int denominator, Image& out);
  void reset_geometry(int64_t width, int64_t height);
  bool has_resize() const;

  const EncodedImage* encoded_; // null when the sample started from pixels
  const std::string* name_;
  DecodeOptions options_;
  bool decoded_ = false; // the source is pixels_ (decoded), not encoded_
  Image pixels_;         // the source once decoded
  // When set, the decoded source is this image of another sample (view_of), not pixels_.
  const Image* borrowed_ = nullptr;
  int64_t source_width_;
  int64_t source_height_;

  PixelRegion box_;      // in the source
  int64_t resize_width_; // == box_.width and resize_height_ == box_.height: no resize
  int64_t resize_height_;
  Interpolation interpolation_ = Interpolation::kBilinear;
  PixelRegion window_; // in the resized box; may reach outside it
  bool flip_ = false;
  int last_denominator_ = 1;
};

} // namespace largo::data
