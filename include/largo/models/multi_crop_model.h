// A model over several views of each image (VISSL's multi-input forward for SwAV and
// SimCLR): the views of one resolution are concatenated and run through the trunk together,
// the features of every view are concatenated in view order, and the head runs once on them.
// With 2 x 224 + 6 x 96 crops of n images that is two trunk passes, [2n, 3, 224, 224] and
// [6n, 3, 96, 96], and the head's rows are view-major (view 0 of every image, then view 1,
// ...), the order swav_loss and simclr_info_nce_loss take.
//
// Its input is one tensor, the views packed side by side (pack_views), so that every
// parallel mode, which runs a module on one input tensor, runs this model as it is. The
// trunk and the head are the TrunkHeadModel's own (the same parameters, named "trunk.<block>.*"
// and "head.*"), so a checkpoint's trunk initializes a linear evaluation of it.
// With `pad_views` (VISSL's create_multidimensional_tensor, padded_crops.h) the views are
// padded to the largest and run through the trunk in one pass instead, the trunk's global
// average pool replaced by one that averages each view's unpadded part.
// No collectives.
#pragma once

#include <largo/models/module_swap.h>
#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <vector>

namespace largo::models {

// views[k]: [n, channels, h_k, w_k] (data::Batch::views) -> [n, Σ_k channels·h_k·w_k], each
// image's views flattened side by side, float32 (uint8 views are converted).
at::Tensor pack_views(const std::vector<at::Tensor>& views);

// Σ_k channels·h_k·w_k of `view_shapes` ([channels, h, w] each): the width pack_views makes.
int64_t packed_size(const std::vector<std::vector<int64_t>>& view_shapes);
// The inverse of pack_views: packed [n, packed_size(view_shapes)] -> each view
// [n, channels, h, w] (views of `packed`, no copy). Throws naming `model` (e.g. "the MoCo
// model") when `packed` is not that wide.
std::vector<at::Tensor> unpack_views(
    const at::Tensor& packed,
    const std::vector<std::vector<int64_t>>& view_shapes,
    const std::string& model);

class MultiCropModelImpl : public torch::nn::Module, public SwappableChildren {
 public:
  // `view_shapes`: [channels, h, w] of each view, in view order (data::Dataset::view_shapes).
  // The head is `model`'s: a SwavHead as its only element returns [embedding, scores of each
  // prototype set], which forward concatenates along dim 1; any other head one tensor.
  // Throws ConfigError for fewer than 2 views, and with `pad_views` for a trunk that does
  // not end in a global average pool (resnet and regnet do).
  MultiCropModelImpl(
      const TrunkHeadModel& model,
      std::vector<std::vector<int64_t>> view_shapes,
      bool pad_views = false);

  // packed [n, Σ view numels] (pack_views) -> the head's output for every view, view-major:
  // [num_views * n, width].
  at::Tensor forward(const at::Tensor& packed);

  // The views of `packed`, [n, channels, h_k, w_k] each (views into a copy of its rows).
  std::vector<at::Tensor> unpack(const at::Tensor& packed) const;

  const std::vector<std::vector<int64_t>>& view_shapes() const {
    return view_shapes_;
  }
  bool pads_views() const {
    return pad_views_;
  }
  // Runs of consecutive views of one shape ([begin, end) view indices): one trunk pass each
  // (one pass for all with pads_views).
  const std::vector<std::pair<int64_t, int64_t>>& resolution_groups() const {
    return groups_;
  }
  const torch::nn::Sequential& trunk() const {
    return trunk_;
  }
  const torch::nn::Sequential& head() const {
    return head_;
  }
  // "trunk" or "head", replaced by a Sequential (models/module_swap.h).
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  at::Tensor forward_head(const at::Tensor& features);

  torch::nn::Sequential trunk_{nullptr};
  torch::nn::Sequential head_{nullptr};
  std::vector<std::vector<int64_t>> view_shapes_;
  std::vector<std::pair<int64_t, int64_t>> groups_;
  int64_t packed_size_; // packed_size(view_shapes_)
  bool pad_views_;
};

TORCH_MODULE(MultiCropModel);

} // namespace largo::models
