#include <largo/parallel/pipeline/pipeline_stages.h>

#include <largo/core/error.h>
#include <largo/models/trunk_head_model.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <map>

namespace largo::parallel {

std::vector<PipelineBlock>
pipeline_blocks(const torch::nn::Sequential& sequential, const std::string& prefix) {
  std::vector<PipelineBlock> blocks;
  size_t index = 0;
  for (const auto& element : *sequential) {
    const std::string leaf = std::to_string(index++);
    blocks.push_back({prefix.empty() ? leaf : prefix + "." + leaf, element});
  }
  return blocks;
}

std::vector<PipelineBlock> pipeline_blocks(models::TrunkHeadModelImpl& model) {
  auto blocks = pipeline_blocks(model.trunk(), "trunk");
  auto head = pipeline_blocks(model.head(), "head");
  blocks.insert(blocks.end(), head.begin(), head.end());
  return blocks;
}

std::string to_string(StageBalance balance) {
  switch (balance) {
  case StageBalance::kParameters:
    return "parameters";
  case StageBalance::kTime:
    return "time";
  case StageBalance::kBlocks:
    return "blocks";
  }
  return "?";
}

StageBalance parse_stage_balance(const std::string& name) {
  for (auto balance : {StageBalance::kParameters, StageBalance::kTime, StageBalance::kBlocks}) {
    if (name == to_string(balance)) {
      return balance;
    }
  }
  throw OptionError("PipelineParallelOptions::balance", name, "parameters, time or blocks");
}

std::vector<double> block_parameter_counts(const std::vector<PipelineBlock>& blocks) {
  std::vector<double> counts;
  for (const auto& block : blocks) {
    int64_t count = 0;
    for (const auto& parameter : block.module.ptr()->parameters()) {
      count += parameter.numel();
    }
    counts.push_back(static_cast<double>(count));
  }
  return counts;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One forward + backward of each block in turn; returns each block's seconds.
std::vector<double> time_blocks_once(const std::vector<PipelineBlock>& blocks, at::Tensor x) {
  std::vector<double> seconds;
  for (auto block : blocks) { // AnyModule::forward is not const; the copy shares the module
    at::Tensor input = x.detach().requires_grad_(x.is_floating_point());
    const auto start = std::chrono::steady_clock::now();
    at::Tensor output = block.module.forward<at::Tensor>(input);
    if (output.requires_grad()) {
      torch::autograd::backward({output}, {at::ones_like(output)});
    }
    seconds.push_back(seconds_since(start));
    x = output.detach();
  }
  return seconds;
}

} // namespace

std::vector<double> measure_block_seconds(
    const std::vector<PipelineBlock>& blocks, const at::Tensor& sample, int repeats) {
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_grads; // (parameter, its .grad)
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_buffers; // (buffer, a copy)
  for (const auto& block : blocks) {
    for (auto& parameter : block.module.ptr()->parameters()) {
      saved_grads.emplace_back(parameter, parameter.grad());
    }
    for (auto& buffer : block.module.ptr()->buffers()) { // BatchNorm's running statistics
      saved_buffers.emplace_back(buffer, buffer.clone());
    }
  }
  time_blocks_once(blocks, sample); // warm-up: first-call allocations and kernel choices
  std::vector<std::vector<double>> runs;
  for (int i = 0; i < std::max(repeats, 1); ++i) {
    runs.push_back(time_blocks_once(blocks, sample));
  }
  for (auto& [parameter, grad] : saved_grads) {
    parameter.mutable_grad() = grad;
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [buffer, copy] : saved_buffers) {
      buffer.copy_(copy);
    }
  }
  std::vector<double> medians;
  for (size_t b = 0; b < blocks.size(); ++b) {
    std::vector<double> times;
    for (const auto& run : runs) {
      times.push_back(run[b]);
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    medians.push_back(times[times.size() / 2]);
  }
  return medians;
}

std::vector<int64_t> balanced_stage_boundaries(const std::vector<double>& costs, int num_stages) {
  if (num_stages < 1 || static_cast<size_t>(num_stages) > costs.size()) {
    throw ConfigError(fmt::format(
        "cannot cut a model of {} blocks into {} pipeline stages (pipeline size x "
        "PipelineParallelOptions::virtual_stages): every stage needs at least one block",
        costs.size(),
        num_stages));
  }
  return balanced_segment_boundaries(costs, num_stages);
}

std::vector<int64_t> cut_into_stages(
    const std::vector<PipelineBlock>& blocks,
    int num_stages,
    const std::vector<int64_t>& boundaries,
    StageBalance balance,
    const std::function<std::vector<double>()>& block_seconds) {
  if (!boundaries.empty()) {
    check_stage_boundaries(boundaries, static_cast<int64_t>(blocks.size()), num_stages);
    return boundaries;
  }
  std::vector<double> costs;
  switch (balance) {
  case StageBalance::kParameters:
    costs = block_parameter_counts(blocks);
    break;
  case StageBalance::kBlocks:
    costs.assign(blocks.size(), 1.0);
    break;
  case StageBalance::kTime:
    costs = block_seconds();
    break;
  }
  return balanced_stage_boundaries(costs, num_stages);
}

void check_stage_boundaries(
    const std::vector<int64_t>& boundaries, int64_t num_blocks, int num_stages) {
  if (static_cast<int>(boundaries.size()) != num_stages + 1 ||
      !is_segmentation(boundaries, num_blocks)) {
    throw ConfigError(fmt::format(
        "PipelineParallelOptions::boundaries = [{}]: expected {} strictly increasing block "
        "indices from 0 to {} (the model has {} blocks; {} stages = pipeline size x "
        "PipelineParallelOptions::virtual_stages), e.g. [{}]",
        fmt::join(boundaries, ", "),
        num_stages + 1,
        num_blocks,
        num_blocks,
        num_stages,
        num_stages <= num_blocks
            ? fmt::format(
                  "{}", fmt::join(segment_boundaries_by_count(num_blocks, num_stages), ", "))
            : std::string("fewer stages")));
  }
}

// ---- PipelineStage ----------------------------------------------------------------------

PipelineStageImpl::PipelineStageImpl(std::vector<PipelineBlock> blocks) {
  // "trunk.3" becomes child "trunk" (a plain holder module) with child "3", the block.
  std::map<std::string, std::shared_ptr<torch::nn::Module>> holders;
  for (auto& block : blocks) {
    torch::nn::Module* parent = this;
    std::string path;
    std::string rest = block.name;
    for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      const std::string part = rest.substr(0, dot);
      path += (path.empty() ? "" : ".") + part;
      auto& holder = holders[path];
      if (!holder) {
        holder = parent->register_module(part, std::make_shared<torch::nn::Module>(part));
      }
      parent = holder.get();
      rest = rest.substr(dot + 1);
    }
    parent->register_module(rest, block.module.ptr());
    names_.push_back(block.name);
    blocks_.push_back(std::move(block.module));
  }
}

at::Tensor PipelineStageImpl::forward(at::Tensor x) {
  for (auto& block : blocks_) {
    x = block.forward<at::Tensor>(std::move(x));
  }
  return x;
}

} // namespace largo::parallel
