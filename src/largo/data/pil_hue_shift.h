// torchvision's adjust_hue on a PIL image, the pixel arithmetic: PIL's RGB -> HSV (Pillow 9
// Convert.c), the hue byte shifted with uint8 wrap-around, HSV -> RGB. Private to the data
// layer.
#pragma once

#include <cstdint>

namespace largo::data::detail {

// Shifts the hue of `count` interleaved RGB pixels in place, byte for byte as PIL's
// image.convert("HSV"), h += shift (mod 256), .convert("RGB") would.
void pil_shift_hue(uint8_t* rgb, int64_t count, uint8_t shift);

} // namespace largo::data::detail
