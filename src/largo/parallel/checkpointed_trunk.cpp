#include <largo/parallel/checkpointed_trunk.h>

#include <largo/core/error.h>
#include <largo/core/memory_tracker.h>
#include <largo/core/rng_state.h>
#include <largo/parallel/activation_checkpoint.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace largo::parallel {
namespace {

const char* kSplitsKey = "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS";

torch::Device model_device(models::TrunkHeadModel& model) {
  auto parameters = model->parameters();
  return parameters.empty() ? torch::Device(torch::kCPU) : parameters.front().device();
}

// Puts back what a probe pass changes: gradients, BatchNorm statistics (every buffer),
// train/eval mode and the RNG state of the CPU and of the model's CUDA device. During the
// probe every parameter that requires grad has a zero gradient, allocated before any
// measurement, so the probes measure activations, not the gradients.
class ProbeGuard {
 public:
  explicit ProbeGuard(models::TrunkHeadModel& model)
      : model_(model), was_training_(model->is_training()), cpu_rng_(cpu_rng_state()) {
    torch::NoGradGuard no_grad;
    for (auto& parameter : model_->parameters()) {
      gradients_.push_back(parameter.grad());
      parameter.mutable_grad() =
          parameter.requires_grad() ? torch::zeros_like(parameter) : at::Tensor();
    }
    for (auto& buffer : model_->buffers()) {
      buffers_.push_back(buffer.clone());
    }
    const torch::Device device = model_device(model_);
    if (device.is_cuda()) {
      cuda_generator_ = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(cuda_generator_->mutex());
      cuda_rng_ = cuda_generator_->get_state();
    }
    model_->train();
  }

  ~ProbeGuard() {
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (auto& parameter : model_->parameters()) {
      parameter.mutable_grad() = gradients_[i++];
    }
    i = 0;
    for (auto& buffer : model_->buffers()) {
      buffer.copy_(buffers_[i++]);
    }
    model_->train(was_training_);
    set_cpu_rng_state(cpu_rng_);
    if (cuda_generator_) {
      std::lock_guard<std::mutex> lock(cuda_generator_->mutex());
      cuda_generator_->set_state(cuda_rng_);
    }
  }

  ProbeGuard(const ProbeGuard&) = delete;
  ProbeGuard& operator=(const ProbeGuard&) = delete;

 private:
  models::TrunkHeadModel& model_;
  bool was_training_;
  at::Tensor cpu_rng_;
  std::optional<at::Generator> cuda_generator_;
  at::Tensor cuda_rng_;
  std::vector<at::Tensor> gradients_;
  std::vector<at::Tensor> buffers_;
};

at::Tensor probe_batch(
    const std::vector<int64_t>& sample_shape, int64_t batch_size, const torch::Device& device) {
  std::vector<int64_t> shape{batch_size};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  // Zeros: the bytes do not depend on the values, and zeros draw nothing from the RNG.
  return at::zeros(shape, at::TensorOptions().device(device));
}

std::string segments_text(const std::vector<int64_t>& boundaries) {
  std::string text;
  for (size_t s = 0; s + 1 < boundaries.size(); ++s) {
    text += fmt::format("{}[{}, {})", s == 0 ? "" : " ", boundaries[s], boundaries[s + 1]);
  }
  return text;
}

} // namespace

std::optional<std::vector<int64_t>>
measure_trunk_block_activation_bytes(models::TrunkHeadModel& model, const at::Tensor& probe_input) {
  const torch::Device device = model_device(model);
  if (!MemoryTracker::supported(device)) {
    return std::nullopt;
  }
  MemoryTracker tracker(device);
  ProbeGuard guard(model);
  torch::AutoGradMode grad_mode(true);
  std::vector<int64_t> bytes;
  {
    // The whole graph stays alive through `x` until the end of this scope, so the growth of
    // the live bytes across a block is what it holds for the backward (and its output).
    at::Tensor x = probe_input;
    for (int64_t block = 0; block < model->num_trunk_blocks(); ++block) {
      const int64_t before = tracker.current_bytes();
      x = model->forward_trunk_range(x, block, block + 1);
      bytes.push_back(std::max<int64_t>(0, tracker.current_bytes() - before));
    }
  }
  return bytes;
}

CheckpointedTrunk::CheckpointedTrunk(
    models::TrunkHeadModel model, std::vector<int64_t> boundaries, bool preserve_rng_state)
    : model_(std::move(model)),
      boundaries_(std::move(boundaries)),
      preserve_rng_state_(preserve_rng_state) {
  const int64_t num_blocks = model_->num_trunk_blocks();
  bool ok = boundaries_.size() >= 2 && boundaries_.front() == 0 && boundaries_.back() == num_blocks;
  for (size_t i = 1; ok && i < boundaries_.size(); ++i) {
    ok = boundaries_[i] > boundaries_[i - 1];
  }
  if (!ok) {
    throw Error(fmt::format(
        "segment boundaries [{}] do not cut the model's {} trunk blocks into non-empty "
        "segments; expected 0 = b_0 < b_1 < ... < b_n = {}",
        fmt::join(boundaries_, ", "),
        num_blocks,
        num_blocks));
  }
}

CheckpointedTrunk CheckpointedTrunk::plan(
    models::TrunkHeadModel model,
    const TrunkCheckpointingOptions& options,
    const std::vector<int64_t>& sample_shape) {
  const int64_t num_blocks = model->num_trunk_blocks();
  if (options.num_splits() < 1 || options.num_splits() > num_blocks) {
    throw ConfigError(fmt::format(
        "config key {} = {}: expected a number of segments from 1 to {} (the model's trunk has "
        "{} blocks)",
        kSplitsKey,
        options.num_splits(),
        num_blocks,
        num_blocks));
  }
  if (options.probe_batch_size() < 1) {
    throw Error(fmt::format(
        "TrunkCheckpointingOptions::probe_batch_size = {}: expected an integer >= 1",
        options.probe_batch_size()));
  }
  std::vector<int64_t> block_bytes;
  if (options.cost() == SegmentCost::kActivationBytes) {
    auto measured = measure_trunk_block_activation_bytes(
        model, probe_batch(sample_shape, options.probe_batch_size(), model_device(model)));
    if (measured) {
      block_bytes = std::move(*measured);
    } else {
      spdlog::warn(
          "activation checkpointing: the memory of {} cannot be measured with this libtorch, "
          "so the trunk is cut into segments of equal block counts instead of balanced "
          "activation bytes",
          model_device(model).str());
    }
  }
  std::vector<int64_t> boundaries;
  std::string cut_by;
  if (!block_bytes.empty()) {
    std::vector<double> costs(block_bytes.begin(), block_bytes.end());
    boundaries = balanced_segment_boundaries(costs, options.num_splits());
    cut_by = fmt::format(
        "cut to balance measured activation bytes (probe batch {})", options.probe_batch_size());
  } else {
    boundaries = segment_boundaries_by_count(num_blocks, options.num_splits());
    cut_by = "cut into equal block counts";
  }
  CheckpointedTrunk trunk(std::move(model), std::move(boundaries), options.preserve_rng_state());
  trunk.block_activation_bytes_ = std::move(block_bytes);
  trunk.cut_by_ = std::move(cut_by);
  return trunk;
}

at::Tensor CheckpointedTrunk::forward(at::Tensor images) {
  // The segments hold the model so the recompute can run it whenever the backward comes.
  std::shared_ptr<models::TrunkHeadModelImpl> model = model_.ptr();
  at::Tensor features = forward_trunk(
      std::move(images), [model](const at::Tensor& x, int64_t begin, int64_t end) {
        return model->forward_trunk_range(x, begin, end);
      });
  return model->forward_head(std::move(features));
}

at::Tensor CheckpointedTrunk::forward_trunk(at::Tensor images, const TrunkBlockRunner& run_blocks) {
  at::Tensor x = std::move(images);
  for (size_t s = 0; s + 2 < boundaries_.size(); ++s) {
    const int64_t begin = boundaries_[s];
    const int64_t end = boundaries_[s + 1];
    std::vector<std::shared_ptr<torch::nn::Module>> blocks;
    for (int64_t block = begin; block < end; ++block) {
      blocks.push_back(model_->trunk_block(block));
    }
    x = checkpoint_modules(
            blocks,
            [run_blocks, begin, end](const std::vector<at::Tensor>& inputs) {
              return std::vector<at::Tensor>{run_blocks(inputs[0], begin, end)};
            },
            {std::move(x)},
            preserve_rng_state_)
            .front();
  }
  return run_blocks(std::move(x), boundaries_[boundaries_.size() - 2], model_->num_trunk_blocks());
}

std::string CheckpointedTrunk::describe() const {
  const int64_t num_segments = static_cast<int64_t>(boundaries_.size()) - 1;
  std::string text = fmt::format(
      "trunk blocks {}; the first {} of {} segments checkpointed; {}",
      segments_text(boundaries_),
      num_checkpointed_segments(),
      num_segments,
      cut_by_);
  if (!block_activation_bytes_.empty()) {
    std::vector<std::string> sizes;
    for (size_t s = 0; s + 1 < boundaries_.size(); ++s) {
      int64_t bytes = 0;
      for (int64_t block = boundaries_[s]; block < boundaries_[s + 1]; ++block) {
        bytes += block_activation_bytes_[block];
      }
      sizes.push_back(format_bytes(bytes));
    }
    text += fmt::format(" ({} per segment)", fmt::join(sizes, ", "));
  }
  return text;
}

std::string ActivationMemoryReport::describe() const {
  return fmt::format(
      "peak activation memory of a training step at batch {}: {} without checkpointing, {} "
      "with it ({:.0f} % saved; {}); a step that frees its gradients also allocates {} of "
      "gradients",
      batch_size,
      format_bytes(peak_bytes_without),
      format_bytes(peak_bytes_with),
      100.0 * saved_fraction(),
      how,
      format_bytes(gradient_bytes));
}

std::optional<ActivationMemoryReport> measure_activation_memory(
    CheckpointedTrunk& trunk, const std::vector<int64_t>& sample_shape, int64_t batch_size) {
  models::TrunkHeadModel& model = trunk.model();
  const torch::Device device = model_device(model);
  if (!MemoryTracker::supported(device)) {
    return std::nullopt;
  }
  if (batch_size < 1) {
    throw Error(
        fmt::format("measure_activation_memory: batch_size = {}, expected >= 1", batch_size));
  }
  MemoryTracker tracker(device);
  ProbeGuard guard(model);
  torch::AutoGradMode grad_mode(true);
  auto step_peak = [&](int64_t batch, bool checkpointed) {
    at::Tensor images = probe_batch(sample_shape, batch, device);
    tracker.start_window();
    {
      at::Tensor output = checkpointed ? trunk.forward(images) : model->forward(images);
      output.sum().backward();
    }
    return tracker.window_peak_bytes();
  };
  ActivationMemoryReport report;
  report.batch_size = batch_size;
  for (const auto& parameter : model->parameters()) {
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
    return static_cast<int64_t>(std::llround(
        static_cast<double>(small) + per_sample * static_cast<double>(batch_size - kSmall)));
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
