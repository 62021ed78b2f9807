// VISSL's padded multi-crop forward (multicrop_collator with create_multidimensional_tensor,
// as SEER's regnet10B.yaml sets it): the crops of every size are padded with zeros at the
// bottom and the right to the largest crop's size and run through the trunk as one batch
// (BatchNorm in training normalises over the whole padded batch, as in VISSL); the trunk's
// global average pool then averages each crop's feature map over the part its unpadded pixels
// reach: the padding mask sampled onto the feature map by nearest interpolation, as VISSL's
// get_tunk_forward_interpolated_outputs cuts it before its avgpool block. Convolutions near
// the padding see zeros where the separate passes of MultiCropModel see their own border, so
// the two forwards differ by design (one trunk pass instead of one per crop size).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace largo::models {

// views[k]: [n, c, h_k, w_k] -> [num_views * n, c, H, W], H and W the largest of the views',
// view-major (view 0 of every image first), each view at the top left and zeros elsewhere
// (VISSL's MultiDimensionalTensor.from_tensors).
at::Tensor pad_views_to_largest(const std::vector<at::Tensor>& views);

// How many of the `out` rows (or columns) of a feature map the padding mask marks unpadded,
// for `valid` unpadded rows of `padded` input rows: PyTorch's nearest interpolation to `out`
// samples row min(floor(j * (padded / out)), padded - 1) for output row j (in float32, as
// ATen's nearest_idx; exact for out == padded and out == 2 * padded).
int64_t nearest_valid_extent(int64_t valid, int64_t padded, int64_t out);

// The global average pool (adaptive_avg_pool2d to 1x1, flattened) of each view's unpadded
// part: x [num_views * n, C, h, w] view-major -> [num_views * n, C]. No parameters.
class PaddedCropPoolImpl : public torch::nn::Module {
 public:
  // (h_k, w_k) of each view, in view order.
  explicit PaddedCropPoolImpl(std::vector<std::pair<int64_t, int64_t>> view_sizes);
  at::Tensor forward(const at::Tensor& x);

 private:
  std::vector<std::pair<int64_t, int64_t>> view_sizes_;
  int64_t padded_height_ = 0;
  int64_t padded_width_ = 0;
};
TORCH_MODULE(PaddedCropPool);

} // namespace largo::models
