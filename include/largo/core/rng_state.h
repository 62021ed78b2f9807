// The random state a run depends on, so a checkpoint can restore it and a resumed run
// continues bit for bit: libtorch's default CPU generator (weight init, dropout) and,
// in CUDA builds, each device's generator.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace largo {

// Seed libtorch's CPU (and CUDA) generators.
void seed_everything(uint64_t seed);

// The CPU generator's state as a uint8 tensor (what torch.get_rng_state() returns).
at::Tensor cpu_rng_state();
void set_cpu_rng_state(const at::Tensor& state);

} // namespace largo
