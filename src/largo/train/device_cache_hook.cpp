#include <largo/train/device_cache_hook.h>

#include <largo/core/error.h>

#include <ATen/DeviceAccelerator.h>
#include <spdlog/spdlog.h>

namespace largo::train {

DeviceCacheHook::DeviceCacheHook(torch::Device device, int64_t every)
    : device_(device), every_(every) {
  if (every_ <= 0) {
    throw OptionError(
        "TrainerOptions::empty_device_cache_every", std::to_string(every_), "an integer > 0");
  }
}

// The progress has moved past the step, so its iteration is the next step's: emptying here
// is emptying before that step, as VISSL does.
void DeviceCacheHook::on_step_end(const StepEvent& event) {
  if (!device_.is_cuda() || event.progress.iteration % every_ != 0) {
    return;
  }
  at::accelerator::emptyCache();
  ++times_emptied_;
  spdlog::debug("emptied the CUDA cache before iteration {}", event.progress.iteration);
}

} // namespace largo::train
