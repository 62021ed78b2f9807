// PIL's extended box blur (Pillow 9 libImaging/BoxBlur.c), the kernel of
// ImageFilter.GaussianBlur. Private to the data layer.
#pragma once

#include "largo/data/image.h"

namespace largo::data::detail {

// `passes` extended box blurs of `radius` along the rows, then `passes` along the columns,
// in PIL's 8.24 fixed point with the edge pixels extended: byte for byte PIL's
// ImagingBoxBlur(image, radius, passes) on an RGB image.
void pil_box_blur(Image& image, float radius, int passes);

} // namespace largo::data::detail
