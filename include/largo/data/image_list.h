// Where a split's image files are and what their labels are, found in one of VISSL's two
// on-disk layouts:
//   disk_folder   torchvision's ImageFolder layout: one subfolder per class under a root.
//                 Classes are the sorted subfolder names (label = position), samples are
//                 listed as torchvision lists them (class by class; within a class, folders
//                 in sorted path order, files sorted by name, symlinks followed; only names
//                 ending in one of torchvision's image extensions, case-insensitively), so
//                 sample i is the same file in Largo and in torchvision.datasets.ImageFolder.
//   disk_filelist VISSL's form: a .npy array of image paths and a .npy array of labels.
// Nothing is opened or decoded here; bad files are found when a sample is loaded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace largo::data {

// Where the encoded bytes of a list's samples are when they are not files of their own (a
// WebDataset's images are members of tar files: webdataset_index.h). Called by several
// loader threads at once.
class ImageBytesSource {
 public:
  virtual ~ImageBytesSource() = default;
  // Reads sample `index`'s encoded image into `bytes`; throws DataError naming it.
  virtual void read(int64_t index, std::vector<uint8_t>& bytes) const = 0;
};

struct ImageList {
  // One per sample: the file, or (with bytes_source) the name errors give the sample.
  std::vector<std::string> paths;
  std::vector<int64_t> labels; // one per sample, >= 0
  // disk_folder: the class folder names, in label order; disk_filelist: empty.
  std::vector<std::string> class_names;
  // Null: paths are the image files. Otherwise the samples' bytes come from it.
  std::shared_ptr<const ImageBytesSource> bytes_source;

  int64_t size() const;
  // class_names.size(), or 1 + the largest label when there are no names.
  int64_t num_classes() const;
};

// torchvision's IMG_EXTENSIONS: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp.
// (Largo decodes JPEG and PNG; a file of another format is listed, as torchvision lists it,
// and loading it raises DataError naming the file.)
const std::vector<std::string>& image_extensions();

// An ImageFolder tree's classes, the sorted names of the root's subfolders (torchvision's
// find_classes), without listing their images. Throws DataError naming `root` when it is
// not a directory or has no subfolder.
std::vector<std::string> list_class_folders(const std::filesystem::path& root);

// Lists an ImageFolder tree. Throws DataError naming `root` when it is not a directory or
// has no class subfolder, and naming the classes that hold no image file unless
// `allow_empty_classes` (then they keep their label and a warning names them).
ImageList list_image_folder(const std::filesystem::path& root, bool allow_empty_classes = false);

// Reads a VISSL file list: `paths_npy` a 1-D string array ('<U' or '|S') of image paths,
// `labels_npy` a 1-D integer array of the same length, or empty for a list without labels
// (every label 0: for LABEL_TYPE sample_index, which replaces them). A path starting with
// `remove_prefix` (when not empty) has it replaced by `new_prefix` (VISSL's
// REMOVE_IMG_PATH_PREFIX / NEW_IMG_PATH_PREFIX). Throws DataError naming the file for an
// unreadable array, a wrong dtype, different lengths or a negative label.
ImageList list_image_filelist(
    const std::filesystem::path& paths_npy,
    const std::filesystem::path& labels_npy,
    const std::string& remove_prefix = "",
    const std::string& new_prefix = "");

} // namespace largo::data
