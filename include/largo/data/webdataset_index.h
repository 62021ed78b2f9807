// A WebDataset -- tar shards of samples grouped by basename -- indexed from its tar headers,
// as an ImageList whose samples are read straight out of the tars.
//
// The format (webdataset's): consecutive members that share a key (the member's path up to
// the first '.' of its file name) form one sample; the rest of the name, lower-cased, is the
// field. A sample here needs one image field, jpg, jpeg or png, and a cls field holding its
// class as a decimal integer (what webdataset writes for an int); other fields (json, txt,
// ...) are ignored. Samples are numbered shard by shard in the order the shard list gives,
// and in tar order within a shard: sample i is the same in every rank and every epoch.
//
// Building the index reads every member's 512-byte header and each cls field (a few bytes),
// never an image: one pass over the shards' headers at start-up, which also gives each
// shard's sample count (for WebDatasetSampler) and the class count (the largest label + 1).
// An index is built once per process and pattern (open_dataset and peek_dataset_shape share
// it while the shards' sizes and modification times are unchanged).
//
// Errors are DataErrors naming the shard and the member: a truncated or corrupt tar, a
// sample without a label or without an image, a cls field that is not an integer >= 0. With
// skip_bad_samples the sample is dropped from the index instead (a truncated shard keeps the
// samples before the damage), warned about and counted. An image that does not decode is
// found when it is loaded (ImageDataset), named "shard.tar:member".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "largo/data/image_list.h"

namespace largo::data {

struct WebDatasetShards {
  // paths[i] names sample i as "shard.tar:key.jpg"; labels from the cls fields; the images
  // are read from the tars (bytes_source).
  ImageList list;
  std::vector<std::string> shard_paths;
  std::vector<int64_t> shard_sizes; // samples of each shard, in shard_paths order
  int64_t num_bad_samples = 0;      // dropped (skip_bad_samples)
};

// Indexes the shards `pattern` names (shard_list.h). Throws DataError as above, and when no
// sample is left.
std::shared_ptr<const WebDatasetShards>
index_webdataset(const std::string& pattern, bool skip_bad_samples);

// The same for a list of tar files already expanded.
std::shared_ptr<const WebDatasetShards>
index_webdataset(const std::vector<std::string>& shard_paths, bool skip_bad_samples);

} // namespace largo::data
