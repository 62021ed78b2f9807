// The positional embedding of a ViT for inputs of another size than the one it was built
// for, as VISSL's VisionTransformer.interpolate_pos_encoding (after DINO's) makes it: DINO
// trains one trunk on 224 px global and 96 px local crops, whose patch grids differ.
//
// The class token's row is kept; the patch rows, a [grid, grid] map of d channels, are
// resized by bicubic interpolation with scale factor sqrt(input patches / built patches)
// (align_corners false), the factor given to the kernel as is. That factor, not the ratio
// of the sizes, is what VISSL passes (recompute_scale_factor unset), so the same call here
// gives the same floats.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace largo::models {

// pos_embedding [1, 1 + built_grid^2, d] (row 0: the class token's) ->
// [1, 1 + input_grid^2, d]. Throws an Error naming both grids when the interpolated map
// is not input_grid x input_grid (the scale factor's rounding could make it one short).
at::Tensor interpolate_position_embedding(
    const at::Tensor& pos_embedding, int64_t built_grid, int64_t input_grid);

} // namespace largo::models
