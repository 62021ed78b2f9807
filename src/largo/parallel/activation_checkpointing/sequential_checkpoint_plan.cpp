#include <largo/parallel/activation_checkpointing/sequential_checkpoint_plan.h>

#include <largo/core/byte_format.h>
#include <largo/core/error.h>
#include <largo/core/memory_tracker.h>
#include <largo/core/rng_state.h>
#include <largo/models/module_device.h>
#include <largo/parallel/activation_checkpointing/checkpointed_segments.h>
#include <largo/parallel/activation_checkpointing/sequential_interception.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace largo::parallel {
namespace {

// Puts back what a probe pass changes: gradients, BatchNorm statistics (every buffer),
// train/eval mode and the RNG state of the CPU and of the module's CUDA device. During the
// probe every parameter that requires grad has a zero gradient, allocated before any
// measurement, so the probes measure activations, not the gradients.
class ProbeGuard {
 public:
  explicit ProbeGuard(torch::nn::Module& module)
      : module_(module), was_training_(module.is_training()), cpu_rng_(cpu_rng_state()) {
    torch::NoGradGuard no_grad;
    for (auto& parameter : module_.parameters()) {
      gradients_.push_back(parameter.grad());
      parameter.mutable_grad() =
          parameter.requires_grad() ? torch::zeros_like(parameter) : at::Tensor();
    }
    for (auto& buffer : module_.buffers()) {
      buffers_.push_back(buffer.clone());
    }
    const torch::Device device = models::module_device(module_);
    if (device.is_cuda()) {
      cuda_generator_ = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(cuda_generator_->mutex());
      cuda_rng_ = cuda_generator_->get_state();
    }
    module_.train();
  }

  ~ProbeGuard() {
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (auto& parameter : module_.parameters()) {
      parameter.mutable_grad() = gradients_[i++];
    }
    i = 0;
    for (auto& buffer : module_.buffers()) {
      buffer.copy_(buffers_[i++]);
    }
    module_.train(was_training_);
    set_cpu_rng_state(cpu_rng_);
    if (cuda_generator_) {
      std::lock_guard<std::mutex> lock(cuda_generator_->mutex());
      cuda_generator_->set_state(cuda_rng_);
    }
  }

  ProbeGuard(const ProbeGuard&) = delete;
  ProbeGuard& operator=(const ProbeGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
  at::Tensor cpu_rng_;
  std::optional<at::Generator> cuda_generator_;
  at::Tensor cuda_rng_;
  std::vector<at::Tensor> gradients_;
  std::vector<at::Tensor> buffers_;
};

at::Tensor probe_batch(const std::vector<int64_t>& sample_shape, int64_t batch_size,
                       const torch::Device& device) {
  std::vector<int64_t> shape{batch_size};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  // Zeros: the bytes do not depend on the values, and zeros draw nothing from the RNG.
  return at::zeros(shape, at::TensorOptions().device(device));
}

// What `container`'s first element receives when `model` runs on `input` (the rest of the
// forward runs too, without grad).
at::Tensor captured_container_input(torch::nn::AnyModule model,
                                    torch::nn::SequentialImpl& container, const at::Tensor& input) {
  torch::nn::AnyModule first = sequential_element_forward(container, 0);
  at::Tensor captured;
  intercept_sequential_element(container, 0, [&](const at::Tensor& x) {
    captured = x.detach().clone();
    return first.forward<at::Tensor>(x);
  });
  try {
    torch::NoGradGuard no_grad;
    model.forward<at::Tensor>(input);
  } catch (...) {
    *container.begin() = first;
    throw;
  }
  *container.begin() = first;
  if (!captured.defined()) {
    throw Error("activation checkpointing: the Sequential to cut is not run by the module's "
                "forward, so where to cut it cannot be measured");
  }
  return captured;
}

} // namespace

std::string SequentialCheckpointPlan::describe(const std::string& container_name) const {
  std::vector<std::string> segments;
  for (size_t s = 0; s + 1 < boundaries.size(); ++s) {
    segments.push_back(fmt::format("[{}, {})", boundaries[s], boundaries[s + 1]));
  }
  const auto num_segments = static_cast<int64_t>(boundaries.size()) - 1;
  std::string text = fmt::format("{} {}; the first {} of {} segments checkpointed; {}",
                                 container_name, fmt::join(segments, " "), num_segments - 1,
                                 num_segments, cut_by);
  if (!element_bytes.empty()) {
    std::vector<std::string> sizes;
    for (size_t s = 0; s + 1 < boundaries.size(); ++s) {
      int64_t bytes = 0;
      for (int64_t element = boundaries[s]; element < boundaries[s + 1]; ++element) {
        bytes += element_bytes[static_cast<size_t>(element)];
      }
      sizes.push_back(format_bytes(bytes));
    }
    text += fmt::format(" ({} per segment)", fmt::join(sizes, ", "));
  }
  return text;
}

std::optional<std::vector<int64_t>> measure_sequential_activation_bytes(
    torch::nn::AnyModule model, torch::nn::SequentialImpl& container,
    const at::Tensor& probe_input) {
  torch::nn::Module& module = *model.ptr();
  const torch::Device device = models::module_device(module);
  if (!MemoryTracker::supported(device)) {
    return std::nullopt;
  }
  ProbeGuard guard(module);
  const at::Tensor input = captured_container_input(model, container, probe_input);
  MemoryTracker tracker(device);
  torch::AutoGradMode grad_mode(true);
  std::vector<int64_t> bytes;
  {
    // The whole graph stays alive through `x` until the end of this scope, so the growth of
    // the live bytes across an element is what it holds for the backward (and its output).
    at::Tensor x = input;
    for (size_t i = 0; i < container.size(); ++i) {
      const int64_t before = tracker.current_bytes();
      x = sequential_element_forward(container, i).forward<at::Tensor>(x);
      bytes.push_back(std::max<int64_t>(0, tracker.current_bytes() - before));
    }
  }
  return bytes;
}

SequentialCheckpointPlan plan_sequential_checkpointing(
    torch::nn::AnyModule model, torch::nn::SequentialImpl& container,
    const std::string& container_name, int64_t num_splits, SegmentCost cost,
    const std::vector<int64_t>& probe_input_shape, int64_t probe_batch_size) {
  const auto size = static_cast<int64_t>(container.size());
  if (num_splits < 1 || num_splits > size) {
    throw OptionError(
        "ActivationCheckpointingOptions::num_splits", std::to_string(num_splits),
        fmt::format("a number of segments from 1 to {} ({} has {} elements)", size,
                    container_name, size));
  }
  if (probe_batch_size < 1) {
    throw OptionError("ActivationCheckpointingOptions::probe_batch_size",
                      std::to_string(probe_batch_size), "an integer >= 1");
  }
  SequentialCheckpointPlan plan;
  const torch::Device device = models::module_device(*model.ptr());
  if (cost == SegmentCost::kActivationBytes && !probe_input_shape.empty()) {
    auto measured = measure_sequential_activation_bytes(
        model, container, probe_batch(probe_input_shape, probe_batch_size, device));
    if (measured) {
      plan.element_bytes = std::move(*measured);
    } else {
      spdlog::warn("activation checkpointing: the memory of {} cannot be measured with this "
                   "libtorch, so {} is cut into segments of equal block counts instead of "
                   "balanced activation bytes",
                   device.str(), container_name);
    }
  }
  if (!plan.element_bytes.empty()) {
    std::vector<double> costs(plan.element_bytes.begin(), plan.element_bytes.end());
    plan.boundaries = balanced_segment_boundaries(costs, num_splits);
    plan.cut_by = fmt::format("cut to balance measured activation bytes (probe batch {})",
                              probe_batch_size);
  } else {
    plan.boundaries = segment_boundaries_by_count(size, num_splits);
    plan.cut_by = "cut into equal block counts";
  }
  return plan;
}

std::string ActivationMemoryReport::describe() const {
  return fmt::format(
      "peak activation memory of a training step at batch {}: {} without checkpointing, {} "
      "with it ({:.0f} % saved; {}); a step that frees its gradients also allocates {} of "
      "gradients",
      batch_size, format_bytes(peak_bytes_without), format_bytes(peak_bytes_with),
      100.0 * saved_fraction(), how, format_bytes(gradient_bytes));
}

std::optional<ActivationMemoryReport> measure_activation_memory(
    torch::nn::AnyModule model, torch::nn::Sequential container,
    const std::vector<int64_t>& boundaries, const std::vector<int64_t>& sample_shape,
    int64_t batch_size, bool preserve_rng_state) {
  torch::nn::Module& module = *model.ptr();
  const torch::Device device = models::module_device(module);
  if (!MemoryTracker::supported(device)) {
    return std::nullopt;
  }
  if (batch_size < 1) {
    throw Error(
        fmt::format("measure_activation_memory: batch_size = {}, expected >= 1", batch_size));
  }
  MemoryTracker tracker(device);
  ProbeGuard guard(module);
  torch::AutoGradMode grad_mode(true);
  auto step_peak = [&](int64_t batch, bool checkpointed) {
    at::Tensor images = probe_batch(sample_shape, batch, device);
    std::unique_ptr<CheckpointedSegments> segments;
    if (checkpointed) {
      segments = CheckpointedSegments::split_sequential(container, "probe", boundaries,
                                                        preserve_rng_state);
    }
    tracker.start_window();
    {
      at::Tensor output = model.forward<at::Tensor>(images);
      output.sum().backward();
    }
    return tracker.window_peak_bytes();
  };
  ActivationMemoryReport report;
  report.batch_size = batch_size;
  for (const auto& parameter : module.parameters()) {
    if (parameter.requires_grad()) {
      report.gradient_bytes += static_cast<int64_t>(parameter.nbytes());
    }
  }
  constexpr int64_t kSmall = 2;
  constexpr int64_t kLarge = 4;
  if (batch_size <= kLarge) {
    report.peak_bytes_without = step_peak(batch_size, false);
    report.peak_bytes_with = step_peak(batch_size, true);
    report.how = fmt::format("measured on probe steps at batch {}", batch_size);
    return report;
  }
  auto project = [&](int64_t small, int64_t large) {
    const double per_sample = static_cast<double>(large - small) / (kLarge - kSmall);
    return static_cast<int64_t>(std::llround(static_cast<double>(small) +
                                             per_sample * static_cast<double>(batch_size - kSmall)));
  };
  const int64_t without_small = step_peak(kSmall, false);
  const int64_t without_large = step_peak(kLarge, false);
  const int64_t with_small = step_peak(kSmall, true);
  const int64_t with_large = step_peak(kLarge, true);
  report.peak_bytes_without = project(without_small, without_large);
  report.peak_bytes_with = project(with_small, with_large);
  report.how =
      fmt::format("projected linearly from probe steps at batch {} and {}", kSmall, kLarge);
  return report;
}

} // namespace largo::parallel
