// idx file parsing. zlib's gzread reads gzip and uncompressed files alike, so one reader
// serves both; the payload is decompressed straight into the tensor that keeps it.
#include "largo/data/idx_dataset.h"

#include <array>
#include <cerrno>
#include <climits>
#include <cstring>

#include <fmt/format.h>
#include <zlib.h>

#include "largo/core/error.h"
#include "largo/core/resources.h"

namespace largo::data {
namespace {

// A gzip (or raw) file opened for reading; closes itself.
class GzReader {
 public:
  explicit GzReader(const std::filesystem::path& path) : path_(path) {
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      throw DataError(fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
    }
    gzbuffer(file_, 1 << 20); // larger than the 8 KiB default: fewer syscalls
  }
  ~GzReader() {
    gzclose(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `num_bytes`; returns how many were read (fewer only at end of data).
  // A truncated gzip stream counts as end of data (the caller reports the short length);
  // other zlib errors throw.
  int64_t read(void* out, int64_t num_bytes) {
    auto* dst = static_cast<unsigned char*>(out);
    int64_t total = 0;
    while (total < num_bytes) {
      const unsigned chunk =
          static_cast<unsigned>(std::min<int64_t>(num_bytes - total, INT_MAX / 2));
      const int got = gzread(file_, dst + total, chunk);
      if (got < 0) {
        int errnum = 0;
        const char* message = gzerror(file_, &errnum);
        if (errnum == Z_BUF_ERROR) { // "unexpected end of file": a truncated .gz
          break;
        }
        throw DataError(fmt::format(
            "cannot read {}: {} (is the file corrupt? download it "
            "again)",
            path_.string(),
            message));
      }
      if (got == 0) {
        break;
      }
      total += got;
    }
    return total;
  }

  // Counts (and discards) the bytes left, for error messages about over-long files.
  int64_t count_remaining() {
    std::array<unsigned char, 1 << 16> sink{};
    int64_t total = 0;
    while (true) {
      const int64_t got = read(sink.data(), static_cast<int64_t>(sink.size()));
      total += got;
      if (got < static_cast<int64_t>(sink.size())) {
        return total;
      }
    }
  }

 private:
  std::filesystem::path path_;
  gzFile file_ = nullptr;
};

uint32_t read_big_endian_u32(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

std::string describe_length(const std::filesystem::path& path) {
  return path.extension() == ".gz" ? "bytes after decompression" : "bytes";
}

// Reads the header (magic + dims) of an idx file and checks the magic number.
std::vector<int64_t> read_header(
    GzReader& reader,
    const std::filesystem::path& path,
    uint32_t expected_magic,
    int num_dims,
    const char* kind) {
  const int64_t header_bytes = 4 * (1 + num_dims);
  std::array<unsigned char, 16> header{};
  const int64_t got = reader.read(header.data(), header_bytes);
  if (got < header_bytes) {
    throw DataError(fmt::format(
        "{} is truncated: expected at least {} {} (the idx header), "
        "got {}; download the file again",
        path.string(),
        header_bytes,
        describe_length(path),
        got));
  }
  const uint32_t magic = read_big_endian_u32(header.data());
  if (magic != expected_magic) {
    throw DataError(fmt::format(
        "{} is not an idx {} file: magic number is {} (0x{:08x}), "
        "expected {} (0x{:08x})",
        path.string(),
        kind,
        magic,
        magic,
        expected_magic,
        expected_magic));
  }
  std::vector<int64_t> dims;
  for (int d = 0; d < num_dims; ++d) {
    dims.push_back(read_big_endian_u32(header.data() + 4 * (1 + d)));
  }
  return dims;
}

// Reads exactly tensor.nbytes() payload bytes into `tensor` and checks that nothing
// follows them, so any length mismatch with the header is reported in bytes.
void read_payload(
    GzReader& reader, const std::filesystem::path& path, int64_t header_bytes, at::Tensor& tensor) {
  const int64_t payload_bytes = static_cast<int64_t>(tensor.nbytes());
  const int64_t got = reader.read(tensor.data_ptr(), payload_bytes);
  if (got < payload_bytes) {
    throw DataError(fmt::format(
        "{} is truncated: its header promises {} {}, the file has {}; "
        "download the file again",
        path.string(),
        header_bytes + payload_bytes,
        describe_length(path),
        header_bytes + got));
  }
  const int64_t extra = reader.count_remaining();
  if (extra > 0) {
    throw DataError(fmt::format(
        "{} is longer than its header says: expected {} {}, the file "
        "has {}; is it an idx file?",
        path.string(),
        header_bytes + payload_bytes,
        describe_length(path),
        header_bytes + payload_bytes + extra));
  }
}

// A header's sizes against the file, before any allocation: a damaged or hostile header
// (2^32 - 1 images) must not make Largo ask for terabytes. deflate packs at most 1032
// bytes into one, so a .gz file of n bytes holds at most 1032 n.
void check_payload_fits_file(const std::filesystem::path& path, int64_t header_bytes,
                             uint64_t payload_bytes, const std::string& what) {
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) {
    return; // the read reports it
  }
  const bool gz = path.extension() == ".gz";
  const uint64_t most = gz ? saturating_product({file_bytes, 1032}) : file_bytes;
  if (payload_bytes > most || static_cast<uint64_t>(header_bytes) + payload_bytes > most) {
    throw DataError(fmt::format(
        "{}: its header promises {} ({} {}), but the file has {} bytes{}; the file is "
        "truncated or damaged: download it again",
        path.string(), what, header_bytes + payload_bytes, describe_length(path), file_bytes,
        gz ? " (compressed)" : ""));
  }
  require_memory(payload_bytes, fmt::format("loading {} ({})", path.string(), what));
}

// The first of `candidates` that exists; DataError listing all of them otherwise.
std::filesystem::path find_file(
    const std::vector<std::filesystem::path>& candidates,
    const std::filesystem::path& root_dir,
    Split split) {
  for (const auto& candidate : candidates) {
    if (std::filesystem::is_regular_file(candidate)) {
      return candidate;
    }
  }
  std::string tried;
  for (const auto& candidate : candidates) {
    tried += fmt::format("\n  {}", candidate.string());
  }
  throw DataError(fmt::format(
      "MNIST-format {} data not found in '{}'{}; tried:{}\n"
      "Install Fashion-MNIST with `apt-get install dataset-fashion-mnist` (it goes to {}), "
      "put MNIST/Fashion-MNIST idx files (.gz or raw) in a directory, or point "
      "DataSourceOptions::path ({} split) at the directory that holds them.",
      to_string(split),
      root_dir.string(),
      std::filesystem::is_directory(root_dir) ? "" : " (no such directory)",
      tried,
      kFashionMnistSystemDir,
      to_string(split)));
}

std::filesystem::path
find_idx_file(const std::filesystem::path& root_dir, Split split, const std::string& suffix) {
  const std::string base = (split == Split::kTrain ? "train-" : "t10k-") + suffix;
  return find_file({root_dir / base, root_dir / (base + ".gz")}, root_dir, split);
}

} // namespace

IdxDataset::IdxDataset(at::Tensor images, at::Tensor labels)
    : InMemoryDataset(std::move(images), std::move(labels), kNumClasses) {}

at::Tensor IdxDataset::read_images(const std::filesystem::path& path) {
  GzReader reader(path);
  const std::vector<int64_t> dims = read_header(reader, path, kImagesMagic, 3, "image (idx3)");
  const int64_t num_images = dims[0];
  const int64_t rows = dims[1];
  const int64_t cols = dims[2];
  if (rows == 0 || cols == 0) {
    throw DataError(fmt::format(
        "{}: images must have non-zero size, header says {}x{}", path.string(), rows, cols));
  }
  // Each dim is < 2^32, but their product could overflow; real datasets are far smaller.
  int64_t payload_bytes = 0;
  if (__builtin_mul_overflow(num_images, rows * cols, &payload_bytes)) {
    throw DataError(fmt::format(
        "{}: header dims {}x{}x{} are too large", path.string(), num_images, rows, cols));
  }
  check_payload_fits_file(path, 16, static_cast<uint64_t>(payload_bytes),
                          fmt::format("{} images of {}x{}", num_images, rows, cols));
  at::Tensor images = at::empty({num_images, 1, rows, cols}, at::kByte); // [N, 1, rows, cols]
  read_payload(reader, path, 16, images);
  return images;
}

at::Tensor IdxDataset::read_labels(const std::filesystem::path& path) {
  GzReader reader(path);
  const std::vector<int64_t> dims = read_header(reader, path, kLabelsMagic, 1, "label (idx1)");
  check_payload_fits_file(path, 8, static_cast<uint64_t>(dims[0]), fmt::format("{} labels", dims[0]));
  // Held as int64 too, once read.
  require_memory(saturating_product({static_cast<uint64_t>(dims[0]), 8}),
                 fmt::format("the {} labels of {}", dims[0], path.string()));
  at::Tensor labels = at::empty({dims[0]}, at::kByte); // [N]
  read_payload(reader, path, 8, labels);
  return labels.to(at::kLong);
}

std::filesystem::path IdxDataset::images_file(const std::filesystem::path& root_dir, Split split) {
  return find_idx_file(root_dir, split, "images-idx3-ubyte");
}

IdxDataset IdxDataset::load(const std::filesystem::path& root_dir, Split split) {
  const auto images_path = images_file(root_dir, split);
  const auto labels_path = find_idx_file(root_dir, split, "labels-idx1-ubyte");
  at::Tensor images = read_images(images_path);
  at::Tensor labels = read_labels(labels_path);
  if (images.size(0) != labels.size(0)) {
    throw DataError(fmt::format(
        "{} holds {} images but {} holds {} labels; the two files must "
        "come from the same dataset and split",
        images_path.string(),
        images.size(0),
        labels_path.string(),
        labels.size(0)));
  }
  if (labels.numel() > 0) {
    const int64_t max_label = labels.max().item<int64_t>();
    if (max_label >= kNumClasses) {
      throw DataError(fmt::format(
          "{}: label {} is out of range, expected 0..{}",
          labels_path.string(),
          max_label,
          kNumClasses - 1));
    }
  }
  return IdxDataset(std::move(images), std::move(labels));
}

} // namespace largo::data
