#include <largo/models/multi_crop_model.h>

#include <largo/core/error.h>
#include <largo/models/padded_crops.h>
#include <largo/models/resnet.h>
#include <largo/models/swav_head.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

namespace largo::models {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t size : shape) {
    count *= size;
  }
  return count;
}

// `trunk` with its last element, a GlobalAvgPool, replaced by the PaddedCropPool of
// `view_shapes` (the same element names; no parameters change).
torch::nn::Sequential with_padded_crop_pool(
    const torch::nn::Sequential& trunk, const std::vector<std::vector<int64_t>>& view_shapes) {
  if (trunk->is_empty() || !trunk->ptr(trunk->size() - 1)->as<GlobalAvgPoolImpl>()) {
    throw ConfigError(
        "padded crops (VISSL's create_multidimensional_tensor) need a trunk that ends in a "
        "global average pool (resnet, regnet), which averages each crop's unpadded part");
  }
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (const auto& shape : view_shapes) {
    sizes.emplace_back(shape.at(1), shape.at(2));
  }
  torch::nn::Sequential padded;
  auto element = trunk->begin();
  for (size_t i = 0; i + 1 < trunk->size(); ++i, ++element) {
    padded->push_back(*element); // the same module (an AnyModule holds a shared pointer)
  }
  padded->push_back(PaddedCropPool(std::move(sizes)));
  return padded;
}

} // namespace

at::Tensor pack_views(const std::vector<at::Tensor>& views) {
  TORCH_CHECK(!views.empty(), "pack_views: no views");
  std::vector<at::Tensor> flat;
  flat.reserve(views.size());
  for (const at::Tensor& view : views) {
    flat.push_back(view.reshape({view.size(0), -1}).to(at::kFloat));
  }
  return at::cat(flat, 1);
}

int64_t packed_size(const std::vector<std::vector<int64_t>>& view_shapes) {
  int64_t values = 0;
  for (const auto& shape : view_shapes) {
    values += numel_of(shape);
  }
  return values;
}

std::vector<at::Tensor> unpack_views(
    const at::Tensor& packed,
    const std::vector<std::vector<int64_t>>& view_shapes,
    const std::string& model) {
  const int64_t width = packed_size(view_shapes);
  if (packed.dim() != 2 || packed.size(1) != width) {
    throw Error(fmt::format(
        "the {} takes [images, {}] (its {} views packed by pack_views), got [{}]",
        model,
        width,
        view_shapes.size(),
        fmt::join(packed.sizes(), ", ")));
  }
  std::vector<at::Tensor> views;
  int64_t offset = 0;
  for (const auto& shape : view_shapes) {
    std::vector<int64_t> sizes{packed.size(0)};
    sizes.insert(sizes.end(), shape.begin(), shape.end());
    views.push_back(packed.narrow(1, offset, numel_of(shape)).reshape(sizes));
    offset += numel_of(shape);
  }
  return views;
}

MultiCropModelImpl::MultiCropModelImpl(
    const TrunkHeadModel& model, std::vector<std::vector<int64_t>> view_shapes, bool pad_views)
    : view_shapes_(std::move(view_shapes)),
      packed_size_(packed_size(view_shapes_)),
      pad_views_(pad_views) {
  trunk_ = register_module(
      "trunk", pad_views ? with_padded_crop_pool(model->trunk(), view_shapes_) : model->trunk());
  head_ = register_module("head", model->head());
  if (view_shapes_.size() < 2) {
    throw ConfigError(fmt::format(
        "a multi-crop model needs at least 2 views per image, got {}; use a TRANSFORMS list "
        "with ImgPilToMultiCrop or ImgReplicatePil",
        view_shapes_.size()));
  }
  for (int64_t k = 0; k < static_cast<int64_t>(view_shapes_.size()); ++k) {
    if (k == 0 || view_shapes_[k] != view_shapes_[k - 1]) {
      groups_.emplace_back(k, k + 1);
    } else {
      groups_.back().second = k + 1;
    }
  }
}

std::vector<at::Tensor> MultiCropModelImpl::unpack(const at::Tensor& packed) const {
  return unpack_views(packed, view_shapes_, "multi-crop model");
}

at::Tensor MultiCropModelImpl::forward(const at::Tensor& packed) {
  const std::vector<at::Tensor> views = unpack(packed);
  if (pad_views_) {
    return forward_head(trunk_->forward(pad_views_to_largest(views)));
  }
  std::vector<at::Tensor> features;
  for (const auto& [begin, end] : groups_) {
    std::vector<at::Tensor> group(views.begin() + begin, views.begin() + end);
    features.push_back(trunk_->forward(at::cat(group, 0)));
  }
  return forward_head(at::cat(features, 0));
}

at::Tensor MultiCropModelImpl::forward_head(const at::Tensor& features) {
  if (head_->is_empty()) {
    return features;
  }
  if (head_->size() == 1) {
    if (auto* swav = head_->ptr(0)->as<SwavHeadImpl>()) {
      return at::cat(swav->forward(features), 1);
    }
  }
  return head_->forward(features);
}

void MultiCropModelImpl::swap_child(const std::string& name, const SwappedModule& replacement) {
  swap_sequential_member(*this, name, replacement, {{"trunk", &trunk_}, {"head", &head_}});
}

} // namespace largo::models
