#include <largo/parallel/activation_checkpointing/checkpointed_segments.h>

#include <largo/core/error.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>
#include <largo/parallel/activation_checkpointing/sequential_interception.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::parallel {

std::unique_ptr<CheckpointedSegments> CheckpointedSegments::wrap_modules(
    const std::shared_ptr<torch::nn::Module>& root, const WrapPolicy& policy,
    bool preserve_rng_state) {
  std::unique_ptr<CheckpointedSegments> segments(new CheckpointedSegments());
  for (const WrapTarget& target : find_wrap_targets(root, policy)) {
    segments->install(Segment{target.container, target.name, target.index, target.index + 1},
                      preserve_rng_state);
  }
  return segments;
}

std::unique_ptr<CheckpointedSegments> CheckpointedSegments::split_sequential(
    torch::nn::Sequential container, const std::string& container_name,
    std::vector<int64_t> boundaries, bool preserve_rng_state) {
  const auto size = static_cast<int64_t>(container->size());
  check_segmentation(boundaries, size, fmt::format("the {} elements of {}", size, container_name));
  std::unique_ptr<CheckpointedSegments> segments(new CheckpointedSegments());
  for (size_t s = 0; s + 2 < boundaries.size(); ++s) { // the last segment runs normally
    segments->install(
        Segment{container,
                fmt::format("{}[{}, {})", container_name, boundaries[s], boundaries[s + 1]),
                static_cast<size_t>(boundaries[s]), static_cast<size_t>(boundaries[s + 1])},
        preserve_rng_state);
  }
  return segments;
}

// The segment's first element runs the whole segment checkpointed; the others pass their
// input through (their work is done inside it).
void CheckpointedSegments::install(Segment segment, bool preserve_rng_state) {
  auto forwards = std::make_shared<std::vector<torch::nn::AnyModule>>();
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  const auto children = segment.container->named_children();
  for (size_t i = segment.begin; i < segment.end; ++i) {
    forwards->push_back(sequential_element_forward(*segment.container, i));
    modules.push_back(children[i].value());
    replaced_.push_back(Replaced{segment.container, i, forwards->back()});
  }
  auto run = [forwards](const std::vector<at::Tensor>& inputs) {
    at::Tensor x = inputs.front();
    for (torch::nn::AnyModule& forward : *forwards) {
      x = forward.forward<at::Tensor>(std::move(x));
    }
    return std::vector<at::Tensor>{x};
  };
  intercept_sequential_element(
      *segment.container, segment.begin,
      [modules, run, preserve_rng_state](const at::Tensor& x) {
        return checkpoint_modules(modules, run, {x}, preserve_rng_state).front();
      });
  for (size_t i = segment.begin + 1; i < segment.end; ++i) {
    intercept_sequential_element(*segment.container, i, [](const at::Tensor& x) { return x; });
  }
  segments_.push_back(std::move(segment));
}

CheckpointedSegments::~CheckpointedSegments() {
  for (Replaced& replaced : replaced_) {
    *(replaced.container->begin() + static_cast<std::ptrdiff_t>(replaced.index)) =
        replaced.forward;
  }
}

std::string CheckpointedSegments::describe() const {
  std::vector<std::string> parts;
  for (const Segment& segment : segments_) {
    parts.push_back(segment.label);
  }
  return parts.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(parts, ", "));
}

} // namespace largo::parallel
