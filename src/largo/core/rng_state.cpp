#include <largo/core/rng_state.h>

#include <largo/core/error.h>
#include <largo/core/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

namespace largo {

void seed_everything(uint64_t seed) {
  torch::manual_seed(seed); // seeds the CPU generator and, when present, every CUDA one
}

at::Tensor cpu_rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  if (!state.defined() || state.scalar_type() != at::kByte || state.dim() != 1) {
    throw CheckpointError("the checkpoint's CPU RNG state is not a 1-D uint8 tensor");
  }
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  compat::set_generator_state(generator, state);
}

} // namespace largo
