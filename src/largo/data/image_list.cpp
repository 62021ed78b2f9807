// disk_folder listing follows torchvision 0.14's find_classes/make_dataset step by step:
// classes = sorted(entries of root that are directories, symlinks followed); for each class,
// sorted(os.walk(class_dir, followlinks=True)) -- (folder, files) pairs ordered by the folder
// path -- then each folder's file names sorted, keeping names with an image extension.
// Python sorts str by code point, which for UTF-8 names is plain byte order.
#include "largo/data/image_list.h"

#include <algorithm>
#include <cctype>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "largo/core/error.h"
#include "largo/data/npy.h"

namespace largo::data {
namespace {

namespace fs = std::filesystem;

// Folders deeper than this under a class folder are not walked: a symlink loop would
// otherwise recurse forever (Python's os.walk would too; Largo stops and warns).
constexpr int kMaxFolderDepth = 64;

bool has_image_extension(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  for (const std::string& extension : image_extensions()) {
    if (lower.size() >= extension.size() &&
        lower.compare(lower.size() - extension.size(), extension.size(), extension) == 0) {
      return true;
    }
  }
  return false;
}

// Appends (folder, its file names) for `folder` and every folder below it, as os.walk does
// with followlinks=True: a directory entry (symlinks followed) is a folder, anything else
// (files, broken symlinks, FIFOs) is a file name. Unreadable folders are skipped with a
// warning (os.walk skips them silently).
void walk(
    const std::string& folder,
    int depth,
    std::vector<std::pair<std::string, std::vector<std::string>>>& out) {
  if (depth > kMaxFolderDepth) {
    spdlog::warn(
        "disk_folder: not descending into {}: more than {} folder levels (a symlink loop?)",
        folder,
        kMaxFolderDepth);
    return;
  }
  std::error_code error;
  fs::directory_iterator it(folder, error);
  if (error) {
    spdlog::warn("disk_folder: skipping unreadable folder {}: {}", folder, error.message());
    return;
  }
  std::vector<std::string> files;
  std::vector<std::string> subfolders;
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) {
      break;
    }
    const std::string name = it->path().filename().string();
    std::error_code status_error;
    if (it->is_directory(status_error)) {
      subfolders.push_back(folder + "/" + name);
    } else {
      files.push_back(name);
    }
  }
  out.emplace_back(folder, std::move(files));
  for (const std::string& subfolder : subfolders) {
    walk(subfolder, depth + 1, out);
  }
}

} // namespace

std::vector<std::string> list_class_folders(const std::filesystem::path& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) {
    throw DataError(fmt::format(
        "disk_folder: {} is not a directory; DataSourceOptions::path must name a folder holding "
        "one "
        "subfolder per class",
        root.string()));
  }
  std::vector<std::string> classes;
  for (fs::directory_iterator it(root, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    std::error_code status_error;
    if (it->is_directory(status_error)) {
      classes.push_back(it->path().filename().string());
    }
  }
  if (error) {
    throw DataError(fmt::format("disk_folder: cannot read {}: {}", root.string(), error.message()));
  }
  if (classes.empty()) {
    throw DataError(fmt::format(
        "disk_folder: found no class folder in {}; expected one subfolder per class (the "
        "ImageFolder layout root/<class>/<image>)",
        root.string()));
  }
  std::sort(classes.begin(), classes.end());
  return classes;
}

int64_t ImageList::size() const {
  return static_cast<int64_t>(paths.size());
}

int64_t ImageList::num_classes() const {
  if (!class_names.empty()) {
    return static_cast<int64_t>(class_names.size());
  }
  return labels.empty() ? 0 : *std::max_element(labels.begin(), labels.end()) + 1;
}

const std::vector<std::string>& image_extensions() {
  static const std::vector<std::string> extensions{
      ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  return extensions;
}

ImageList list_image_folder(const std::filesystem::path& root, bool allow_empty_classes) {
  ImageList list;
  list.class_names = list_class_folders(root);
  std::vector<std::string> empty_classes;
  const std::string root_text = root.string();
  for (size_t label = 0; label < list.class_names.size(); ++label) {
    std::vector<std::pair<std::string, std::vector<std::string>>> folders;
    walk(root_text + "/" + list.class_names[label], 0, folders);
    std::sort(folders.begin(), folders.end());
    const size_t before = list.paths.size();
    for (auto& [folder, files] : folders) {
      std::sort(files.begin(), files.end());
      for (const std::string& name : files) {
        if (has_image_extension(name)) {
          list.paths.push_back(folder + "/" + name);
          list.labels.push_back(static_cast<int64_t>(label));
        }
      }
    }
    if (list.paths.size() == before) {
      empty_classes.push_back(list.class_names[label]);
    }
  }
  if (!empty_classes.empty()) {
    const std::string message = fmt::format(
        "disk_folder: no image file (extensions {}) in the class folder(s) {} under {}",
        fmt::join(image_extensions(), " "),
        fmt::join(empty_classes, ", "),
        root_text);
    if (!allow_empty_classes) {
      throw DataError(
          message + "; add images, remove the folder(s), or set the skip-bad-samples option to "
                    "keep them as empty classes");
    }
    spdlog::warn("{}; they stay classes with no samples", message);
  }
  return list;
}

ImageList list_image_filelist(
    const std::filesystem::path& paths_npy,
    const std::filesystem::path& labels_npy,
    const std::string& remove_prefix,
    const std::string& new_prefix) {
  ImageList list;
  list.paths = npy_strings(read_npy(paths_npy), paths_npy);
  if (labels_npy.empty()) { // VISSL's LABEL_SOURCES []: no labels are read
    list.labels.assign(list.paths.size(), 0);
  } else {
    list.labels = npy_integers(read_npy(labels_npy), labels_npy);
  }
  if (list.paths.size() != list.labels.size()) {
    throw DataError(fmt::format(
        "disk_filelist: {} lists {} image paths but {} holds {} labels; they must match one to one",
        paths_npy.string(),
        list.paths.size(),
        labels_npy.string(),
        list.labels.size()));
  }
  for (size_t i = 0; i < list.labels.size(); ++i) {
    if (list.labels[i] < 0) {
      throw DataError(fmt::format(
          "disk_filelist: label {} of sample {} in {} is negative; labels must be class indices >= "
          "0",
          list.labels[i],
          i,
          labels_npy.string()));
    }
  }
  if (!remove_prefix.empty()) {
    for (std::string& path : list.paths) {
      if (path.compare(0, remove_prefix.size(), remove_prefix) == 0) {
        path = new_prefix + path.substr(remove_prefix.size());
      }
    }
  }
  return list;
}

} // namespace largo::data
