// VISSL's MODEL.CUDA_CACHE: the CUDA caching allocator's unused blocks handed back to the
// driver (torch.cuda.empty_cache()) every `every` iterations, before the step of each
// iteration that is a multiple of it. It helps a run that fragments memory close to the
// device's limit, at the cost of new cudaMalloc calls after each emptying, which is why VISSL
// leaves it off. A CPU run has no cache to empty: the hook then does nothing. No collectives.
#pragma once

#include <largo/train/training_hooks.h>

#include <torch/types.h>

#include <cstdint>

namespace largo::train {

class DeviceCacheHook : public TrainingHook {
 public:
  // `every` > 0 (TrainerOptions::empty_device_cache_every); throws OptionError otherwise.
  DeviceCacheHook(torch::Device device, int64_t every);

  void on_step_end(const StepEvent& event) override;

  // How many times the cache was emptied (0 on the CPU).
  int64_t times_emptied() const {
    return times_emptied_;
  }

 private:
  torch::Device device_;
  int64_t every_;
  int64_t times_emptied_ = 0;
};

} // namespace largo::train
