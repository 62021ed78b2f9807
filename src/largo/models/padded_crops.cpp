#include <largo/models/padded_crops.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace largo::models {

at::Tensor pad_views_to_largest(const std::vector<at::Tensor>& views) {
  TORCH_CHECK(!views.empty(), "pad_views_to_largest: no views");
  int64_t height = 0;
  int64_t width = 0;
  for (const at::Tensor& view : views) {
    TORCH_CHECK(view.dim() == 4, "pad_views_to_largest: views are [n, c, h, w]");
    height = std::max(height, view.size(2));
    width = std::max(width, view.size(3));
  }
  const at::Tensor& first = views.front();
  const int64_t n = first.size(0);
  at::Tensor padded = at::zeros(
      {static_cast<int64_t>(views.size()) * n, first.size(1), height, width}, first.options());
  for (size_t k = 0; k < views.size(); ++k) {
    padded.narrow(0, static_cast<int64_t>(k) * n, n)
        .narrow(2, 0, views[k].size(2))
        .narrow(3, 0, views[k].size(3))
        .copy_(views[k]);
  }
  return padded;
}

int64_t nearest_valid_extent(int64_t valid, int64_t padded, int64_t out) {
  int64_t count = 0;
  for (int64_t j = 0; j < out; ++j) {
    int64_t source = j;
    if (out == 2 * padded) {
      source = j >> 1;
    } else if (out != padded) {
      const float scale = static_cast<float>(padded) / static_cast<float>(out);
      source =
          std::min(static_cast<int64_t>(std::floor(static_cast<float>(j) * scale)), padded - 1);
    }
    count += source < valid ? 1 : 0;
  }
  return count;
}

PaddedCropPoolImpl::PaddedCropPoolImpl(std::vector<std::pair<int64_t, int64_t>> view_sizes)
    : view_sizes_(std::move(view_sizes)) {
  TORCH_CHECK(!view_sizes_.empty(), "PaddedCropPool: no views");
  for (const auto& [height, width] : view_sizes_) {
    padded_height_ = std::max(padded_height_, height);
    padded_width_ = std::max(padded_width_, width);
  }
}

at::Tensor PaddedCropPoolImpl::forward(const at::Tensor& x) {
  const auto views = static_cast<int64_t>(view_sizes_.size());
  TORCH_CHECK(
      x.dim() == 4 && x.size(0) % views == 0,
      fmt::format(
          "PaddedCropPool: expected [{} views x n, C, h, w], got [{}]",
          views,
          fmt::join(x.sizes(), ", ")));
  const std::vector<at::Tensor> chunks = x.chunk(views, 0);
  std::vector<at::Tensor> pooled;
  pooled.reserve(chunks.size());
  for (int64_t k = 0; k < views; ++k) {
    const auto& [height, width] = view_sizes_[static_cast<size_t>(k)];
    const int64_t rows = nearest_valid_extent(height, padded_height_, x.size(2));
    const int64_t cols = nearest_valid_extent(width, padded_width_, x.size(3));
    const at::Tensor part = chunks[static_cast<size_t>(k)].narrow(2, 0, rows).narrow(3, 0, cols);
    pooled.push_back(torch::adaptive_avg_pool2d(part, {1, 1}).flatten(1));
  }
  return at::cat(pooled, 0);
}

} // namespace largo::models
