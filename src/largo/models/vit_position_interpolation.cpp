#include <largo/models/vit_position_interpolation.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/nn/functional/upsampling.h>

#include <cmath>
#include <vector>

namespace largo::models {

at::Tensor interpolate_position_embedding(
    const at::Tensor& pos_embedding, int64_t built_grid, int64_t input_grid) {
  const int64_t dim = pos_embedding.size(2);
  TORCH_INTERNAL_ASSERT(pos_embedding.size(1) == 1 + built_grid * built_grid);
  const at::Tensor class_row = pos_embedding.narrow(1, 0, 1); // [1, 1, d]
  // [1, n, d] -> [1, d, grid, grid]
  const at::Tensor patch_map = pos_embedding.narrow(1, 1, built_grid * built_grid)
                                   .reshape({1, built_grid, built_grid, dim})
                                   .permute({0, 3, 1, 2});
  // VISSL's factor, in double as Python computes it: sqrt(npatch / nembed).
  const double scale = std::sqrt(
      static_cast<double>(input_grid * input_grid) / static_cast<double>(built_grid * built_grid));
  namespace F = torch::nn::functional;
  const at::Tensor resized = F::interpolate(
      patch_map,
      F::InterpolateFuncOptions()
          .scale_factor(std::vector<double>{scale, scale})
          .mode(torch::kBicubic)
          .align_corners(false)
          // What Python's unset value does (the factor goes to the kernel); libtorch warns on
          // every call when it is left unset.
          .recompute_scale_factor(false)); // [1, d, h', w']
  if (resized.size(2) != input_grid || resized.size(3) != input_grid) {
    throw Error(fmt::format(
        "vision_transformer: interpolating its {}x{} positional embedding by {} gives a {}x{} "
        "grid, not the input's {}x{} patches; use inputs whose patch grid the scale factor "
        "reaches exactly (VISSL's interpolation would fail alike)",
        built_grid,
        built_grid,
        scale,
        resized.size(2),
        resized.size(3),
        input_grid,
        input_grid));
  }
  // [1, d, g, g] -> [1, g * g, d], row-major over the grid like the patch tokens
  const at::Tensor patch_rows = resized.permute({0, 2, 3, 1}).reshape({1, -1, dim});
  return at::cat({class_row, patch_rows}, 1);
}

} // namespace largo::models
