#include <largo/core/shard_random_stream.h>

#include <largo/core/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace largo {
namespace {

// One 64-bit draw of the default CPU generator: the stream every rank of a replica shares.
uint64_t draw_shared_seed() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<at::CPUGeneratorImpl>()->random64();
}

// SplitMix64's finaliser: nearby (draw, stream) pairs give unrelated seeds.
uint64_t mix(uint64_t draw, int64_t stream) {
  uint64_t z = draw + 0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(stream) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Puts a generator's saved state back when the region ends, however it ends.
class GeneratorStateGuard {
 public:
  GeneratorStateGuard(at::Generator generator, uint64_t seed) : generator_(std::move(generator)) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    saved_ = generator_.get_state();
    generator_.set_current_seed(seed);
  }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;
  ~GeneratorStateGuard() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    compat::set_generator_state(generator_, saved_);
  }

 private:
  at::Generator generator_;
  at::Tensor saved_;
};

} // namespace

at::Tensor run_in_shard_random_stream(
    int64_t stream, at::Device device, const std::function<at::Tensor()>& region) {
  const uint64_t seed = mix(draw_shared_seed(), stream);
  GeneratorStateGuard guard(at::globalContext().defaultGenerator(device), seed);
  return region();
}

} // namespace largo
