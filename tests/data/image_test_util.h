// Helpers for the image tests: the checked-in baselines (tests/data/baselines/images, written
// by tests/reference/gen_image_baselines.py), deterministic test images, and JPEG/PNG
// encoders (libjpeg, libpng) to write them.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <jpeglib.h>
#include <nlohmann/json.hpp>
#include <png.h>

#include "largo/data/image.h"
#include "largo/data/image_decoder.h"
#include "largo/data/transform_spec.h"
#include "test_paths.h"

namespace largo::data::testing {

inline std::filesystem::path image_baseline_dir() {
  return std::filesystem::path(largo::test_paths::data_dir()) / "data" / "baselines" / "images";
}

inline const nlohmann::json& image_baselines() {
  static const nlohmann::json baselines = [] {
    std::ifstream file(image_baseline_dir() / "image_baselines.json");
    return nlohmann::json::parse(file);
  }();
  return baselines;
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::vector<uint8_t> bytes;
  read_file_bytes(path, bytes);
  return bytes;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream file(path, std::ios::binary);
  file.write(
      reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A whole image file decoded with Largo's decoder (PNGs are lossless: the reference images).
inline Image decode_file(const std::filesystem::path& path, DecodeOptions options = {}) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  Image image;
  EncodedImage(bytes.data(), bytes.size(), path.string(), options).decode(image);
  return image;
}

// Smooth gradients with a seed-dependent stripe pattern: distinct images per seed.
inline Image pattern_image(int64_t width, int64_t height, int seed) {
  Image image;
  image.reshape(width, height);
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      uint8_t* pixel = image.row(y) + 3 * x;
      pixel[0] = static_cast<uint8_t>((x * 255) / std::max<int64_t>(width - 1, 1));
      pixel[1] = static_cast<uint8_t>((y * 255) / std::max<int64_t>(height - 1, 1));
      pixel[2] =
          static_cast<uint8_t>(((x / (1 + seed % 5)) + (y / (2 + seed % 3)) * 7 + seed * 40) % 256);
    }
  }
  return image;
}

inline std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr error{};
  cinfo.err = jpeg_std_error(&error);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    auto* row = const_cast<JSAMPROW>(image.row(cinfo.next_scanline));
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> bytes(buffer, buffer + size);
  std::free(buffer);
  return bytes;
}

// An RGB PNG; `interlaced` writes Adam7.
inline std::vector<uint8_t> encode_png(const Image& image, bool interlaced = false) {
  std::vector<uint8_t> bytes;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(
      png,
      &bytes,
      [](png_structp p, png_bytep data, png_size_t length) {
        auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(p));
        out->insert(out->end(), data, data + length);
      },
      nullptr);
  png_set_IHDR(
      png,
      info,
      static_cast<png_uint_32>(image.width),
      static_cast<png_uint_32>(image.height),
      8,
      PNG_COLOR_TYPE_RGB,
      interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
      PNG_COMPRESSION_TYPE_DEFAULT,
      PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (int64_t y = 0; y < image.height; ++y) {
    rows[static_cast<size_t>(y)] = const_cast<png_bytep>(image.row(y));
  }
  png_set_rows(png, info, rows.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return bytes;
}

// The largest absolute difference between two images of the same size (-1 if sizes differ).
inline int max_abs_difference(const Image& a, const Image& b) {
  if (a.width != b.width || a.height != b.height) {
    return -1;
  }
  int worst = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    worst = std::max(worst, std::abs(int(a.pixels[i]) - int(b.pixels[i])));
  }
  return worst;
}

inline double mean_abs_difference(const Image& a, const Image& b) {
  double total = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    total += std::abs(int(a.pixels[i]) - int(b.pixels[i]));
  }
  return a.pixels.empty() ? 0.0 : total / static_cast<double>(a.pixels.size());
}

// Planar [3, h, w] bytes -> interleaved Image.
inline Image from_planar(const uint8_t* planar, int64_t width, int64_t height) {
  Image image;
  image.reshape(width, height);
  const int64_t plane = width * height;
  for (int64_t i = 0; i < plane; ++i) {
    for (int c = 0; c < 3; ++c) {
      image.pixels[static_cast<size_t>(3 * i + c)] = planar[c * plane + i];
    }
  }
  return image;
}

// A JSON transform list as the specs a config would give (nested lists and transform lists
// included).
inline std::vector<TransformSpec> specs_of(const nlohmann::json& list) {
  std::vector<TransformSpec> specs;
  for (const auto& entry : list) {
    TransformSpec spec;
    for (const auto& [key, value] : entry.items()) {
      if (key == "name") {
        spec.name = value.get<std::string>();
      } else if (value.is_string()) {
        spec.text_args[key] = value.get<std::string>();
      } else if (value.is_array() && !value.empty() && value[0].is_object()) {
        spec.transform_args[key] = specs_of(value);
      } else if (value.is_array() && !value.empty() && value[0].is_array()) {
        spec.nested_args[key] = value.get<std::vector<std::vector<double>>>();
      } else if (value.is_array()) {
        spec.args[key] = value.get<std::vector<double>>();
      } else {
        spec.args[key] = {value.get<double>()};
      }
    }
    specs.push_back(spec);
  }
  return specs;
}

} // namespace largo::data::testing
