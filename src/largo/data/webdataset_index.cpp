// Grouping tar members into samples, and reading the samples' images back by offset.
#include "largo/data/webdataset_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "largo/core/error.h"
#include "largo/data/shard_list.h"
#include "largo/data/tar_reader.h"

namespace largo::data {
namespace {

constexpr int64_t kMaxNamedBadShardSamples = 10;

// Where one sample's image is.
struct ImageLocation {
  int32_t shard = 0;
  int64_t offset = 0;
  int64_t size = 0;
};

// Reads images by offset. Each loader thread keeps the shard it read last open: a thread
// reads its own shards front to back (WebDatasetSampler), so it opens each once per pass.
class TarImageSource : public ImageBytesSource {
 public:
  TarImageSource(std::vector<std::string> shards, std::vector<ImageLocation> locations)
      : shards_(std::move(shards)), locations_(std::move(locations)) {}

  void read(int64_t index, std::vector<uint8_t>& bytes) const override {
    const ImageLocation& at = locations_[static_cast<size_t>(index)];
    pread_exact(
        open_shard(at.shard),
        at.offset,
        at.size,
        bytes,
        fmt::format("{}: the image of sample {}", shards_[at.shard], index));
  }

 private:
  // The thread's open shard: (source id, shard) -> fd, closed when the thread ends.
  struct OpenShard {
    uint64_t source = 0;
    int32_t shard = -1;
    int fd = -1;
    ~OpenShard() {
      if (fd >= 0) {
        ::close(fd);
      }
    }
  };

  int open_shard(int32_t shard) const {
    thread_local OpenShard open;
    if (open.fd >= 0 && open.source == id_ && open.shard == shard) {
      return open.fd;
    }
    if (open.fd >= 0) {
      ::close(open.fd);
    }
    open = {};
    const int fd = ::open(shards_[shard].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      throw DataError(
          fmt::format("{}: cannot open the shard: {}", shards_[shard], std::strerror(error)));
    }
    open.fd = fd;
    open.source = id_;
    open.shard = shard;
    return fd;
  }

  static std::atomic<uint64_t> next_id_;
  std::vector<std::string> shards_;
  std::vector<ImageLocation> locations_;
  uint64_t id_ = ++next_id_; // tells sources apart in the threads' open-shard slot
};

std::atomic<uint64_t> TarImageSource::next_id_{0};

std::string lower_case(std::string text) {
  for (char& c : text) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return text;
}

// webdataset's base_plus_ext: the key is the path up to the first '.' of the file name.
std::pair<std::string, std::string> key_and_field(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) {
    return {name, ""};
  }
  return {name.substr(0, dot), lower_case(name.substr(dot + 1))};
}

// A sample's members as read, before it is checked.
struct PendingSample {
  std::string key;
  std::optional<TarMember> image;
  std::optional<TarMember> label;
  bool two_images = false;
};

int64_t parse_label(const std::vector<uint8_t>& bytes, const std::string& where) {
  const std::string text(bytes.begin(), bytes.end());
  size_t begin = text.find_first_not_of(" \t\r\n");
  size_t end = text.find_last_not_of(" \t\r\n");
  const std::string digits = begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
  if (digits.empty() || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    throw DataError(fmt::format(
        "{} holds '{}', not a class index (a decimal integer >= 0)",
        where,
        digits.size() > 40 ? digits.substr(0, 40) + "..." : digits));
  }
  return std::stoll(digits);
}

// Indexes one shard into `out`; with skip_bad_samples, counts and warns instead of throwing.
class ShardIndexer {
 public:
  ShardIndexer(WebDatasetShards& out, std::vector<ImageLocation>& locations, bool skip)
      : out_(out), locations_(locations), skip_(skip) {}

  void index(const std::string& path, int32_t shard) {
    int64_t kept = 0;
    PendingSample pending;
    std::optional<TarReader> tar;
    try {
      tar.emplace(path);
      while (std::optional<TarMember> member = tar->next()) {
        auto [key, field] = key_and_field(member->name);
        if (key != pending.key) {
          kept += finish(*tar, pending, shard);
          pending = PendingSample{key, std::nullopt, std::nullopt, false};
        }
        if (field == "jpg" || field == "jpeg" || field == "png") {
          pending.two_images = pending.two_images || pending.image.has_value();
          pending.image = *member;
        } else if (field == "cls") {
          pending.label = *member;
        }
      }
      kept += finish(*tar, pending, shard);
    } catch (const DataError& error) {
      if (!skip_) {
        throw;
      }
      // A truncated or corrupt shard: the samples before the damage stay, and so does the
      // one in progress when its members so far are whole and complete.
      bad(error.what());
      if (tar && pending.image && pending.label && !pending.two_images) {
        kept += finish(*tar, pending, shard);
      }
    }
    out_.shard_sizes.push_back(kept);
  }

 private:
  // Adds a complete sample (returns 1) or reports a bad one (returns 0 when skipping).
  int64_t finish(const TarReader& tar, const PendingSample& sample, int32_t shard) {
    if (sample.key.empty() && !sample.image && !sample.label) {
      return 0; // before the first member, or members without a key
    }
    try {
      return add(tar, sample, shard);
    } catch (const DataError& error) {
      if (!skip_) {
        throw;
      }
      bad(error.what());
      return 0;
    }
  }

  int64_t add(const TarReader& tar, const PendingSample& sample, int32_t shard) {
    const std::string& path = tar.path();
    if (!sample.image || sample.two_images) {
      throw DataError(fmt::format(
          "{}: sample {} has {} image member ({}.jpg, .jpeg or .png); each sample needs one",
          path,
          sample.key,
          sample.two_images ? "more than one" : "no",
          sample.key));
    }
    if (!sample.label) {
      throw DataError(fmt::format(
          "{}: sample {} ({}) has no label member {}.cls",
          path,
          sample.key,
          sample.image->name,
          sample.key));
    }
    const std::string where = fmt::format("{}: member {}", path, sample.label->name);
    if (sample.label->size > 64) {
      throw DataError(
          fmt::format("{} is {} bytes, too long for a class index", where, sample.label->size));
    }
    tar.read(*sample.label, label_bytes_);
    out_.list.labels.push_back(parse_label(label_bytes_, where));
    out_.list.paths.push_back(path + ":" + sample.image->name);
    locations_.push_back({shard, sample.image->data_offset, sample.image->size});
    return 1;
  }

  void bad(const std::string& message) {
    ++out_.num_bad_samples;
    if (out_.num_bad_samples <= kMaxNamedBadShardSamples) {
      spdlog::warn(
          "webdataset: skipping a bad sample ({} so far): {}", out_.num_bad_samples, message);
    }
  }

  WebDatasetShards& out_;
  std::vector<ImageLocation>& locations_;
  bool skip_;
  std::vector<uint8_t> label_bytes_;
};

std::shared_ptr<const WebDatasetShards>
build_index(const std::vector<std::string>& shard_paths, bool skip_bad_samples) {
  auto shards = std::make_shared<WebDatasetShards>();
  shards->shard_paths = shard_paths;
  std::vector<ImageLocation> locations;
  ShardIndexer indexer(*shards, locations, skip_bad_samples);
  for (size_t j = 0; j < shard_paths.size(); ++j) {
    indexer.index(shard_paths[j], static_cast<int32_t>(j));
  }
  if (shards->list.paths.empty()) {
    throw DataError(fmt::format(
        "webdataset: the {} shard(s) from {} hold no sample with an image and a cls label",
        shard_paths.size(),
        shard_paths.front()));
  }
  if (shards->num_bad_samples > kMaxNamedBadShardSamples) {
    spdlog::warn("webdataset: {} bad samples skipped in all", shards->num_bad_samples);
  }
  shards->list.bytes_source = std::make_shared<TarImageSource>(shard_paths, std::move(locations));
  return shards;
}

// What tells one state of a shard list from another: each file's size and mtime.
using ShardStamp = std::vector<std::tuple<std::string, int64_t, int64_t>>;

ShardStamp stamp(const std::vector<std::string>& shard_paths) {
  ShardStamp stamps;
  for (const std::string& path : shard_paths) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) {
      return {}; // indexing will name the file
    }
    stamps.emplace_back(
        path,
        static_cast<int64_t>(info.st_size),
        static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec);
  }
  return stamps;
}

} // namespace

std::shared_ptr<const WebDatasetShards>
index_webdataset(const std::vector<std::string>& shard_paths, bool skip_bad_samples) {
  // One index per process and shard list: the run's plan peeks at the class count, then the
  // loader opens the same shards.
  static std::mutex mutex;
  static std::map<std::pair<ShardStamp, bool>, std::shared_ptr<const WebDatasetShards>> cache;
  const ShardStamp key = stamp(shard_paths);
  std::lock_guard<std::mutex> lock(mutex);
  if (!key.empty()) {
    auto found = cache.find({key, skip_bad_samples});
    if (found != cache.end()) {
      return found->second;
    }
  }
  auto shards = build_index(shard_paths, skip_bad_samples);
  if (!key.empty()) {
    cache[{key, skip_bad_samples}] = shards;
  }
  return shards;
}

std::shared_ptr<const WebDatasetShards>
index_webdataset(const std::string& pattern, bool skip_bad_samples) {
  return index_webdataset(expand_shard_list(pattern), skip_bad_samples);
}

} // namespace largo::data
