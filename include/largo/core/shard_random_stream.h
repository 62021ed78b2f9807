// Randomness for what only one rank holds (Megatron-LM's model-parallel RNG tracker): the
// tensor-parallel ranks of a data replica seed their generators alike, so that dropout on
// replicated activations drops the same elements on every rank; dropout on a rank's own part
// (its attention heads, its share of the MLP's features, its tokens under sequence
// parallelism) must instead draw a mask of its own, and must not move the shared generator by
// an amount that depends on the part's size, or the ranks' shared streams would drift apart.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace largo {

// Runs `region` with the default generator of `device` seeded from one 64-bit draw of the
// default CPU generator mixed with `stream`, then restores that generator. So ranks whose CPU
// generators agree, calling this with different streams, draw different numbers inside the
// region and leave it with their generators still in agreement, whatever each drew inside:
// the region costs the CPU generator one draw and the device's generator nothing. Where the
// CPU generator is restored (a checkpoint's RNG state), the region draws the same again.
// Not reentrant with itself on one device; the generator is restored if `region` throws.
at::Tensor run_in_shard_random_stream(
    int64_t stream, at::Device device, const std::function<at::Tensor()>& region);

} // namespace largo
