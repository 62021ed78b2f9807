// PIL's resampling (Pillow 9 libImaging/Resample.c for the filters, Geometry.c's affine
// nearest-neighbour scaling for NEAREST), reproduced from its published behaviour so that
// every output byte matches.
#include "largo/data/resample.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "largo/core/error.h"
#include "simd_clones.h"

namespace largo::data {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kPi = 3.14159265358979323846;

struct Filter {
  double support;
  double (*weight)(double);
};

double sinc(double x) {
  if (x == 0.0) {
    return 1.0;
  }
  x *= kPi;
  return std::sin(x) / x;
}

double box_weight(double x) {
  return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; // PIL's box: (-0.5, 0.5]
}

double bilinear_weight(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double hamming_weight(double x) {
  x = std::fabs(x);
  if (x == 0.0) {
    return 1.0;
  }
  if (x >= 1.0) {
    return 0.0;
  }
  x *= kPi;
  // PIL writes these constants as floats.
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));
}

double bicubic_weight(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) {
    return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  }
  if (x < 2.0) {
    return (((x - 5) * x + 8) * x - 4) * a;
  }
  return 0.0;
}

double lanczos_weight(double x) {
  return (x >= -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0;
}

Filter filter_of(Interpolation interpolation) {
  switch (interpolation) {
  case Interpolation::kBox:
    return {0.5, box_weight};
  case Interpolation::kBilinear:
    return {1.0, bilinear_weight};
  case Interpolation::kHamming:
    return {1.0, hamming_weight};
  case Interpolation::kBicubic:
    return {2.0, bicubic_weight};
  case Interpolation::kLanczos:
    return {3.0, lanczos_weight};
  case Interpolation::kNearest:
    break;
  }
  return {0.0, nullptr};
}

int32_t to_fixed_point(double weight) {
  return static_cast<int32_t>(
      weight < 0 ? -0.5 + weight * (1 << kPrecisionBits) : 0.5 + weight * (1 << kPrecisionBits));
}

uint8_t fixed_point_to_byte(int32_t accumulator) {
  return static_cast<uint8_t>(std::clamp(accumulator >> kPrecisionBits, 0, 255));
}

} // namespace

Interpolation parse_interpolation(const std::string& name) {
  std::string key = name;
  const size_t dot = key.rfind('.');
  if (dot != std::string::npos) {
    key = key.substr(dot + 1); // InterpolationMode.BILINEAR
  }
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  const std::pair<const char*, Interpolation> names[] = {
      {"nearest", Interpolation::kNearest},
      {"lanczos", Interpolation::kLanczos},
      {"bilinear", Interpolation::kBilinear},
      {"bicubic", Interpolation::kBicubic},
      {"box", Interpolation::kBox},
      {"hamming", Interpolation::kHamming}};
  for (const auto& [text, value] : names) {
    if (key == text || key == std::to_string(static_cast<int>(value))) {
      return value;
    }
  }
  throw ConfigError(fmt::format(
      "unknown interpolation '{}'; expected nearest, bilinear, bicubic, box, hamming or "
      "lanczos (or PIL's code 0-5)",
      name));
}

std::string to_string(Interpolation interpolation) {
  switch (interpolation) {
  case Interpolation::kNearest:
    return "nearest";
  case Interpolation::kLanczos:
    return "lanczos";
  case Interpolation::kBilinear:
    return "bilinear";
  case Interpolation::kBicubic:
    return "bicubic";
  case Interpolation::kBox:
    return "box";
  case Interpolation::kHamming:
    return "hamming";
  }
  return "?";
}

ResampleAxis::ResampleAxis(
    int64_t in_size,
    double in0,
    double in1,
    int64_t out_size,
    int64_t out_begin,
    int64_t out_end,
    Interpolation interpolation) {
  TORCH_CHECK(
      in_size > 0 && out_size > 0 && 0 <= out_begin && out_begin < out_end && out_end <= out_size &&
          0.0 <= in0 && in0 < in1 && in1 <= static_cast<double>(in_size),
      "ResampleAxis: bad geometry");
  const int64_t count = out_end - out_begin;
  // PIL passes the box as floats.
  const auto box0 = static_cast<float>(in0);
  const auto box1 = static_cast<float>(in1);
  identity_ = interpolation != Interpolation::kNearest && out_size == in_size && box0 == 0.0f &&
              box1 == static_cast<float>(out_size);
  first_.resize(static_cast<size_t>(count));
  count_.resize(static_cast<size_t>(count));
  if (identity_ || interpolation == Interpolation::kNearest) {
    kernel_size_ = 1;
    weights_.assign(static_cast<size_t>(count), 1 << kPrecisionBits);
    // Nearest: Geometry.c's scale path walks xo = box0 + scale/2, += scale per pixel.
    const double scale = static_cast<double>(box1 - box0) / static_cast<double>(out_size);
    double position = static_cast<double>(box0) + scale * 0.5;
    for (int64_t x = 0; x < out_end; ++x, position += scale) {
      if (x < out_begin) {
        continue;
      }
      const int64_t source = identity_ ? x : (position < 0.0 ? -1 : static_cast<int64_t>(position));
      first_[static_cast<size_t>(x - out_begin)] = std::clamp<int64_t>(source, 0, in_size - 1);
      count_[static_cast<size_t>(x - out_begin)] = 1;
    }
  } else {
    const Filter filter = filter_of(interpolation);
    const double scale = static_cast<double>(box1 - box0) / static_cast<double>(out_size);
    const double filter_scale = std::max(scale, 1.0);
    const double support = filter.support * filter_scale;
    kernel_size_ = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
    weights_.assign(static_cast<size_t>(count * kernel_size_), 0);
    std::vector<double> k(static_cast<size_t>(kernel_size_));
    for (int64_t xx = out_begin; xx < out_end; ++xx) {
      const double center = box0 + (static_cast<double>(xx) + 0.5) * scale;
      const double ss = 1.0 / filter_scale;
      const int64_t xmin = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
      const int64_t xmax =
          std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size) - xmin;
      double total = 0.0;
      for (int64_t x = 0; x < xmax; ++x) {
        const double w = filter.weight((static_cast<double>(x + xmin) - center + 0.5) * ss);
        k[static_cast<size_t>(x)] = w;
        total += w;
      }
      const size_t i = static_cast<size_t>(xx - out_begin);
      for (int64_t x = 0; x < xmax; ++x) {
        const double w =
            total != 0.0 ? k[static_cast<size_t>(x)] / total : k[static_cast<size_t>(x)];
        weights_[i * static_cast<size_t>(kernel_size_) + static_cast<size_t>(x)] =
            to_fixed_point(w);
      }
      first_[i] = xmin;
      count_[i] = xmax;
    }
  }
  input_begin_ = first_[0];
  input_end_ = first_[0] + count_[0];
  for (size_t i = 0; i < first_.size(); ++i) {
    input_begin_ = std::min(input_begin_, first_[i]);
    input_end_ = std::max(input_end_, first_[i] + count_[i]);
  }
}

int64_t ResampleAxis::input_begin() const {
  return input_begin_;
}

int64_t ResampleAxis::input_end() const {
  return input_end_;
}

int64_t ResampleAxis::output_size() const {
  return static_cast<int64_t>(first_.size());
}

bool ResampleAxis::identity() const {
  return identity_;
}

int64_t ResampleAxis::first(int64_t i) const {
  return first_[static_cast<size_t>(i)];
}

int64_t ResampleAxis::count(int64_t i) const {
  return count_[static_cast<size_t>(i)];
}

const int32_t* ResampleAxis::weights(int64_t i) const {
  return weights_.data() + i * kernel_size_;
}

namespace {

// One horizontal pass over every row of `src`: out is x_axis.output_size() x src.height.
void horizontal_pass(const Image& src, const ResampleAxis& x_axis, Image& out) {
  const int64_t out_width = x_axis.output_size();
  out.reshape(out_width, src.height);
  const int64_t offset = x_axis.input_begin();
  // The taps of every output pixel, gathered once: where they start in a row and how many.
  thread_local std::vector<int64_t> starts;
  thread_local std::vector<int32_t> counts;
  thread_local std::vector<const int32_t*> weights;
  starts.resize(static_cast<size_t>(out_width));
  counts.resize(static_cast<size_t>(out_width));
  weights.resize(static_cast<size_t>(out_width));
  for (int64_t x = 0; x < out_width; ++x) {
    starts[static_cast<size_t>(x)] = (x_axis.first(x) - offset) * Image::kChannels;
    counts[static_cast<size_t>(x)] = static_cast<int32_t>(x_axis.count(x));
    weights[static_cast<size_t>(x)] = x_axis.weights(x);
  }
  for (int64_t y = 0; y < src.height; ++y) {
    const uint8_t* in = src.row(y);
    uint8_t* dst = out.row(y);
    for (int64_t x = 0; x < out_width; ++x) {
      const uint8_t* taps = in + starts[static_cast<size_t>(x)];
      const int32_t* k = weights[static_cast<size_t>(x)];
      const int32_t n = counts[static_cast<size_t>(x)];
      int32_t r = 1 << (kPrecisionBits - 1);
      int32_t g = r;
      int32_t b = r;
      for (int32_t t = 0; t < n; ++t, taps += 3) {
        r += taps[0] * k[t];
        g += taps[1] * k[t];
        b += taps[2] * k[t];
      }
      dst[3 * x] = fixed_point_to_byte(r);
      dst[3 * x + 1] = fixed_point_to_byte(g);
      dst[3 * x + 2] = fixed_point_to_byte(b);
    }
  }
}

// One vertical pass: out is src.width x y_axis.output_size(); src row 0 is input row
// y_axis.input_begin().
LARGO_SIMD_CLONES void vertical_pass(const Image& src, const ResampleAxis& y_axis, Image& out) {
  const int64_t out_height = y_axis.output_size();
  const int64_t values = src.width * Image::kChannels;
  out.reshape(src.width, out_height);
  const int64_t offset = y_axis.input_begin();
  thread_local std::vector<int32_t> accumulators;
  accumulators.resize(static_cast<size_t>(values));
  for (int64_t y = 0; y < out_height; ++y) {
    std::fill(accumulators.begin(), accumulators.end(), 1 << (kPrecisionBits - 1));
    const int32_t* k = y_axis.weights(y);
    const int64_t n = y_axis.count(y);
    // Row by row over the taps: contiguous, so the compiler vectorises the inner loop.
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* in = src.row(y_axis.first(y) - offset + t);
      const int32_t weight = k[t];
      int32_t* acc = accumulators.data();
      for (int64_t v = 0; v < values; ++v) {
        acc[v] += in[v] * weight;
      }
    }
    uint8_t* dst = out.row(y);
    for (int64_t v = 0; v < values; ++v) {
      dst[v] = fixed_point_to_byte(accumulators[static_cast<size_t>(v)]);
    }
  }
}

// Copies rows/columns that a skipped (identity) pass lets through.
void copy_window(
    const Image& src, int64_t x0, int64_t y0, int64_t width, int64_t height, Image& out) {
  out.reshape(width, height);
  for (int64_t y = 0; y < height; ++y) {
    std::memcpy(
        out.row(y),
        src.row(y0 + y) + x0 * Image::kChannels,
        static_cast<size_t>(width * Image::kChannels));
  }
}

} // namespace

void resample(
    const Image& src, const ResampleAxis& x_axis, const ResampleAxis& y_axis, Image& out) {
  TORCH_CHECK(
      src.width == x_axis.input_end() - x_axis.input_begin() &&
          src.height == y_axis.input_end() - y_axis.input_begin(),
      "resample: the source holds ",
      src.width,
      "x",
      src.height,
      " pixels, the taps read ",
      x_axis.input_end() - x_axis.input_begin(),
      "x",
      y_axis.input_end() - y_axis.input_begin());
  thread_local Image horizontal;
  if (x_axis.identity() && y_axis.identity()) {
    copy_window(src, 0, 0, src.width, src.height, out);
    return;
  }
  if (x_axis.identity()) {
    vertical_pass(src, y_axis, out);
    return;
  }
  if (y_axis.identity()) {
    horizontal_pass(src, x_axis, out);
    return;
  }
  horizontal_pass(src, x_axis, horizontal);
  vertical_pass(horizontal, y_axis, out);
}

} // namespace largo::data
