// A dataset of image files (an ImageList from disk_folder or disk_filelist, or a webdataset's
// tar members: ImageList::bytes_source) read through a per-sample pipeline: each sample is
// read from disk, decoded (only the region its transforms keep) and transformed into its
// slot of a uint8 batch [batch, 3, h, w].
//
// Random transforms of sample i in epoch e draw from a generator seeded with
// sample_seed(seed, e, i) (dataset.h): the result does not depend on the batch size, the
// number of loader threads or where an epoch was resumed.
//
// With a MultiViewPipeline each sample becomes several views (multi_view_pipeline.h), each
// written into its own uint8 batch: Batch::views[k], [batch, 3, h_k, w_k].
//
// Bad files -- missing, unreadable, not a regular file, not JPEG/PNG, truncated or corrupt,
// more pixels than DecodeOptions::max_pixels -- raise a DataError naming the file. With
// skip_bad_samples the sample is instead replaced by the next loadable sample in index
// order (wrapping around; its own label and draws), counted in Batch::num_bad_samples and
// num_bad_samples(), and the first few bad files are named in warnings.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "largo/data/dataset.h"
#include "largo/data/image_decoder.h"
#include "largo/data/image_list.h"
#include "largo/data/multi_view_pipeline.h"
#include "largo/data/sample_pipeline.h"

namespace largo::data {

struct ImageDatasetOptions {
  DecodeOptions decode;
  bool skip_bad_samples = false;
  // How many replacement candidates a bad sample tries before the batch fails.
  int64_t max_replacement_tries = 64;
};

class ImageDataset : public Dataset {
 public:
  // When the pipeline does not fix the output size, it is taken from the first sample's
  // header (every image must then give the same size). Throws DataError for an empty list
  // or when that first sample cannot be read; ConfigError for bad options.
  ImageDataset(ImageList list, SamplePipeline pipeline, ImageDatasetOptions options = {});
  // Several views per sample; every view's size must be fixed by the pipeline (as
  // make_multi_view_transforms ensures). Throws ConfigError otherwise.
  ImageDataset(ImageList list, MultiViewPipeline pipeline, ImageDatasetOptions options = {});

  int64_t size() const override;
  std::vector<int64_t> sample_shape() const override; // [3, h, w]; multi-view: view 0's
  std::vector<std::vector<int64_t>> view_shapes() const override;
  int64_t num_classes() const override;
  // Epoch 0 with seed 0 (load_batch with a default request).
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  Batch load_batch(const BatchRequest& request) const override;
  at::Tensor labels() const override;

  // Loads sample `index` (drawing from `gen`) into out, planar uint8 [3, h, w]. Throws
  // DataError naming the file when it cannot; ignores skip_bad_samples.
  void load_sample(int64_t index, at::Generator& gen, uint8_t* out) const;

  const ImageList& list() const;
  // Bad samples replaced so far, over all threads and epochs.
  int64_t num_bad_samples() const;

 private:
  // Loads sample `index` of the request with `load` (candidate index, its generator);
  // returns the number of bad samples skipped to find a loadable one.
  int64_t load_or_replace(
      int64_t index,
      const BatchRequest& request,
      const std::function<void(int64_t, at::Generator&)>& load) const;
  // Checks the list and options, and reads the labels.
  void check_and_read_labels();
  Batch load_views(const BatchRequest& request) const;
  void warn_bad_sample(const std::string& message) const;

  ImageList list_;
  SamplePipeline pipeline_;
  std::optional<MultiViewPipeline> multi_view_;
  ImageDatasetOptions options_;
  ImageSize output_size_;
  std::vector<ImageSize> view_sizes_; // multi-view only
  at::Tensor labels_; // [N] int64
  mutable std::atomic<int64_t> num_bad_samples_{0};
  mutable std::mutex warn_mutex_;
  mutable int64_t num_warnings_ = 0;
};

} // namespace largo::data
