#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>

#include <largo/core/error.h>
#include <largo/core/torch_compat.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/ivalue.h>
#include <atomic>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_set>

namespace largo::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- RNG state ------------------------------------------------------------------------

// The default generators' states of the CPU and of some CUDA devices.
struct RngStates {
  at::Tensor cpu;
  std::vector<std::pair<c10::Device, at::Tensor>> cuda;
};

at::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

RngStates capture_rng(const std::vector<c10::Device>& cuda_devices) {
  RngStates states;
  states.cpu = generator_state(at::detail::getDefaultCPUGenerator());
  for (const auto& device : cuda_devices) {
    states.cuda.emplace_back(device, generator_state(at::globalContext().defaultGenerator(device)));
  }
  return states;
}

void restore_rng(const RngStates& states) {
  set_generator_state(at::detail::getDefaultCPUGenerator(), states.cpu);
  for (const auto& [device, state] : states.cuda) {
    set_generator_state(at::globalContext().defaultGenerator(device), state);
  }
}

// Runs the recompute with the forward's RNG state and puts the caller's back on exit, so
// the caller's generators continue as if the recompute had drawn nothing.
class RngFork {
 public:
  RngFork(const std::vector<c10::Device>& cuda_devices, const RngStates& forward)
      : caller_(capture_rng(cuda_devices)) {
    restore_rng(forward);
  }
  ~RngFork() {
    restore_rng(caller_);
  }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngStates caller_;
};

std::atomic<int64_t> next_recompute_id{1};
thread_local int64_t recompute_id = 0;

// Marks this thread as inside a segment's recompute for its lifetime.
class RecomputeScope {
 public:
  RecomputeScope() : previous_(recompute_id) {
    recompute_id = next_recompute_id.fetch_add(1);
  }
  ~RecomputeScope() {
    recompute_id = previous_;
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  int64_t previous_;
};

// Copies buffers now and copies the values back on destruction.
class BufferRestorer {
 public:
  explicit BufferRestorer(const std::vector<at::Tensor>& buffers) : buffers_(buffers) {
    torch::NoGradGuard no_grad;
    for (const auto& buffer : buffers_) {
      values_.push_back(buffer.clone());
    }
  }
  ~BufferRestorer() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      buffers_[i].copy_(values_[i]);
    }
  }
  BufferRestorer(const BufferRestorer&) = delete;
  BufferRestorer& operator=(const BufferRestorer&) = delete;

 private:
  const std::vector<at::Tensor>& buffers_;
  std::vector<at::Tensor> values_;
};

// ---- autocast state -------------------------------------------------------------------

struct AutocastState {
  bool cpu_enabled = false;
  bool cuda_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache_enabled = true;

  static AutocastState current() {
    AutocastState state;
    state.cpu_enabled = compat::is_autocast_enabled(c10::DeviceType::CPU);
    state.cuda_enabled = compat::is_autocast_enabled(c10::DeviceType::CUDA);
    state.cpu_dtype = compat::get_autocast_dtype(c10::DeviceType::CPU);
    state.cuda_dtype = compat::get_autocast_dtype(c10::DeviceType::CUDA);
    state.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return state;
  }

  void apply() const {
    compat::set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
    compat::set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
    compat::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
    compat::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache_enabled);
  }
};

// Runs a segment with `state`'s autocast switches and dtypes, and the cast cache off; puts
// the caller's state back on exit. The cache is off because the forward runs under no-grad:
// casts cached there would have no autograd history, and a later use of the same weight in
// the autocast region (another segment, the recompute) would take them and lose its
// gradient. A cast gives the same values whether cached or not, so this changes no number.
class SegmentAutocastGuard {
 public:
  explicit SegmentAutocastGuard(const AutocastState& state) : saved_(AutocastState::current()) {
    AutocastState segment = state;
    segment.cache_enabled = false;
    segment.apply();
  }
  ~SegmentAutocastGuard() {
    saved_.apply();
  }
  SegmentAutocastGuard(const SegmentAutocastGuard&) = delete;
  SegmentAutocastGuard& operator=(const SegmentAutocastGuard&) = delete;

 private:
  AutocastState saved_;
};

// ---- the autograd function ------------------------------------------------------------

// What the backward needs besides the saved inputs. Kept in the context as a capsule.
struct SegmentState : torch::CustomClassHolder {
  SegmentFunction function;
  size_t num_inputs = 0;
  std::vector<at::Tensor> parameters; // the ones that require grad, deduplicated
  std::vector<at::Tensor> buffers;
  std::vector<bool> input_requires_grad;
  size_t num_outputs = 0;
  bool preserve_rng_state = true;
  std::vector<c10::Device> cuda_devices; // whose RNG state is stashed
  RngStates forward_rng;
  AutocastState forward_autocast;
};

std::string shape_of(const at::Tensor& tensor) {
  return fmt::format("[{}]", fmt::join(tensor.sizes(), ", "));
}

// Throws unless every leaf that requires grad in the graph behind `roots` is `allowed`: a
// leaf the caller did not declare would get no gradient (torch::autograd::grad is only
// asked for the declared ones), silently.
void check_leaves_declared(
    const variable_list& roots, const std::unordered_set<const c10::TensorImpl*>& allowed) {
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& root : roots) {
    if (root.grad_fn()) {
      stack.push_back(root.grad_fn().get());
    }
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      torch::autograd::Node* next = edge.function.get();
      if (next == nullptr || !seen.insert(next).second) {
        continue;
      }
      if (auto* accumulate = dynamic_cast<torch::autograd::AccumulateGrad*>(next)) {
        const at::Tensor& leaf = accumulate->variable;
        if (allowed.count(leaf.unsafeGetTensorImpl()) == 0) {
          throw Error(fmt::format(
              "a checkpointed segment uses a tensor of shape {} that requires grad but is "
              "neither one of its inputs nor one of its declared parameters, so it would get "
              "no gradient; pass it as an input or in CheckpointOptions::parameters (for a "
              "module segment: register it as a parameter of one of the segment's modules)",
              shape_of(leaf)));
        }
        continue;
      }
      stack.push_back(next);
    }
  }
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // inputs_and_parameters: the segment's inputs, then state->parameters.
  static variable_list forward(
      AutogradContext* ctx,
      const c10::intrusive_ptr<SegmentState>& state,
      at::TensorList inputs_and_parameters) {
    std::vector<at::Tensor> inputs(
        inputs_and_parameters.begin(), inputs_and_parameters.begin() + state->num_inputs);
    state->forward_autocast = AutocastState::current();
    if (state->preserve_rng_state) {
      state->forward_rng = capture_rng(state->cuda_devices);
    }
    std::vector<at::Tensor> outputs;
    {
      SegmentAutocastGuard autocast(state->forward_autocast);
      outputs = state->function(inputs); // grad mode is off here (Function::apply)
    }
    if (outputs.empty()) {
      throw Error("a checkpointed segment returned no outputs; it must return at least one tensor");
    }
    state->num_outputs = outputs.size();
    ctx->save_for_backward(inputs);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    // Undefined output gradients stay undefined: those outputs are left out of the recompute's
    // backward instead of back-propagating zeros.
    ctx->set_materialize_grads(false);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (torch::GradMode::is_enabled()) {
      throw Error(
          "activation checkpointing does not support backward with create_graph=true (double "
          "backward); run that model without checkpointing");
    }
    auto state =
        c10::static_intrusive_pointer_cast<SegmentState>(ctx->saved_data["state"].toCapsule());
    const variable_list saved_inputs = ctx->get_saved_variables();

    // Detached copies of the inputs: the recompute's graph ends at them, so torch::autograd::grad
    // stops there and the outer backward carries the input gradients on.
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved_inputs.size());
    for (size_t i = 0; i < saved_inputs.size(); ++i) {
      if (!saved_inputs[i].defined()) {
        inputs.emplace_back();
        continue;
      }
      inputs.push_back(saved_inputs[i].detach().requires_grad_(state->input_requires_grad[i]));
    }

    // The buffers as they are now (after the forward's own update) are put back when this
    // function returns, after the recompute's graph has been used: restoring them earlier
    // would trip the version check on the running statistics BatchNorm saves for backward.
    BufferRestorer restore_buffers(state->buffers);
    RecomputeScope recompute;
    std::vector<at::Tensor> outputs;
    {
      std::optional<RngFork> rng;
      if (state->preserve_rng_state) {
        rng.emplace(state->cuda_devices, state->forward_rng);
      }
      torch::AutoGradMode grad_mode(true);
      SegmentAutocastGuard autocast(state->forward_autocast);
      outputs = state->function(inputs);
    }
    if (outputs.size() != state->num_outputs) {
      throw Error(fmt::format(
          "a checkpointed segment returned {} outputs when recomputed but {} in the forward; "
          "the segment must compute the same thing each time it is called",
          outputs.size(),
          state->num_outputs));
    }

    // Back-propagate through the recomputed segment to its inputs and parameters, without
    // accumulating into .grad (the outer backward does that, once).
    variable_list roots;
    variable_list root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    variable_list wrt;
    std::vector<size_t> wrt_inputs; // index into inputs for the first entries of wrt
    std::unordered_set<const c10::TensorImpl*> declared;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        wrt_inputs.push_back(i);
        declared.insert(inputs[i].unsafeGetTensorImpl());
      }
    }
    for (const auto& parameter : state->parameters) {
      wrt.push_back(parameter);
      declared.insert(parameter.unsafeGetTensorImpl());
    }
    check_leaves_declared(roots, declared);
    variable_list grads;
    if (!roots.empty() && !wrt.empty()) {
      grads = torch::autograd::grad(
          roots,
          wrt,
          root_grads,
          /*retain_graph=*/false,
          /*create_graph=*/false,
          /*allow_unused=*/true);
    }

    // One gradient per forward argument: none for the state, then the inputs, then the
    // parameters (undefined where there is none).
    variable_list result(1 + inputs.size() + state->parameters.size());
    if (!grads.empty()) {
      for (size_t k = 0; k < wrt_inputs.size(); ++k) {
        result[1 + wrt_inputs[k]] = grads[k];
      }
      for (size_t p = 0; p < state->parameters.size(); ++p) {
        result[1 + inputs.size() + p] = grads[wrt_inputs.size() + p];
      }
    }
    return result;
  }
};

void add_device(std::vector<c10::Device>& devices, const at::Tensor& tensor) {
  if (tensor.defined() && tensor.is_cuda() &&
      std::find(devices.begin(), devices.end(), tensor.device()) == devices.end()) {
    devices.push_back(tensor.device());
  }
}

} // namespace

std::vector<at::Tensor>
checkpoint(SegmentFunction function, std::vector<at::Tensor> inputs, CheckpointOptions options) {
  // The parameters that need a gradient, each once and none that is also an input (a tensor
  // listed twice would have its gradient captured, and accumulated, twice).
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& input : inputs) {
    if (input.defined()) {
      seen.insert(input.unsafeGetTensorImpl());
    }
  }
  std::vector<at::Tensor> parameters;
  for (const auto& parameter : options.parameters()) {
    if (parameter.defined() && parameter.requires_grad() &&
        seen.insert(parameter.unsafeGetTensorImpl()).second) {
      parameters.push_back(parameter);
    }
  }
  bool any_requires_grad = !parameters.empty();
  for (const auto& input : inputs) {
    any_requires_grad = any_requires_grad || (input.defined() && input.requires_grad());
  }
  if (!torch::GradMode::is_enabled() || !any_requires_grad) {
    return function(inputs); // no backward will come: nothing to save or recompute
  }

  auto state = c10::make_intrusive<SegmentState>();
  state->function = std::move(function);
  state->num_inputs = inputs.size();
  state->buffers = options.buffers();
  state->preserve_rng_state = options.preserve_rng_state();
  for (const auto& input : inputs) {
    state->input_requires_grad.push_back(input.defined() && input.requires_grad());
    add_device(state->cuda_devices, input);
  }
  for (const auto& parameter : parameters) {
    add_device(state->cuda_devices, parameter);
  }
  std::vector<at::Tensor> inputs_and_parameters = inputs;
  inputs_and_parameters.insert(inputs_and_parameters.end(), parameters.begin(), parameters.end());
  state->parameters = std::move(parameters);
  return CheckpointFunction::apply(state, at::TensorList(inputs_and_parameters));
}

std::vector<at::Tensor> checkpoint_modules(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
    SegmentFunction function,
    std::vector<at::Tensor> inputs,
    bool preserve_rng_state) {
  CheckpointOptions options;
  options.preserve_rng_state(preserve_rng_state);
  for (const auto& module : modules) {
    for (const auto& parameter : module->parameters(/*recurse=*/true)) {
      options.parameters().push_back(parameter);
    }
    for (const auto& buffer : module->buffers(/*recurse=*/true)) {
      options.buffers().push_back(buffer);
    }
  }
  return checkpoint(std::move(function), std::move(inputs), std::move(options));
}

std::vector<int64_t> segment_boundaries_by_count(int64_t num_blocks, int64_t num_segments) {
  if (num_segments < 1 || num_segments > num_blocks) {
    throw Error(fmt::format(
        "cannot cut {} blocks into {} segments: expected 1 <= segments <= {}",
        num_blocks,
        num_segments,
        num_blocks));
  }
  const int64_t segment_size = num_blocks / num_segments;
  std::vector<int64_t> boundaries;
  for (int64_t i = 0; i < num_segments; ++i) {
    boundaries.push_back(i * segment_size);
  }
  boundaries.push_back(num_blocks);
  return boundaries;
}

std::vector<int64_t>
balanced_segment_boundaries(const std::vector<double>& block_costs, int64_t num_segments) {
  const auto num_blocks = static_cast<int64_t>(block_costs.size());
  if (num_segments < 1 || num_segments > num_blocks) {
    throw Error(fmt::format(
        "cannot cut {} blocks into {} segments: expected 1 <= segments <= {}",
        num_blocks,
        num_segments,
        num_blocks));
  }
  for (double cost : block_costs) {
    if (!(cost >= 0.0) || !std::isfinite(cost)) {
      throw Error(fmt::format("block costs must be finite and >= 0, got {}", cost));
    }
  }
  std::vector<double> prefix(num_blocks + 1, 0.0);
  for (int64_t i = 0; i < num_blocks; ++i) {
    prefix[i + 1] = prefix[i] + block_costs[i];
  }
  // best[s][i]: the smallest possible largest cost when blocks [0, i) form s segments;
  // cut[s][i]: where the last of those segments starts. Blocks are few (tens), so the
  // O(segments * blocks^2) dynamic program is instant.
  const double infinity = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(
      num_segments + 1, std::vector<double>(num_blocks + 1, infinity));
  std::vector<std::vector<int64_t>> cut(num_segments + 1, std::vector<int64_t>(num_blocks + 1, 0));
  best[0][0] = 0.0;
  for (int64_t s = 1; s <= num_segments; ++s) {
    for (int64_t i = s; i <= num_blocks; ++i) {
      for (int64_t start = s - 1; start < i; ++start) {
        const double candidate = std::max(best[s - 1][start], prefix[i] - prefix[start]);
        if (candidate < best[s][i]) {
          best[s][i] = candidate;
          cut[s][i] = start;
        }
      }
    }
  }
  std::vector<int64_t> boundaries(num_segments + 1);
  boundaries[num_segments] = num_blocks;
  for (int64_t s = num_segments; s >= 1; --s) {
    boundaries[s - 1] = cut[s][boundaries[s]];
  }
  return boundaries;
}

bool is_segmentation(const std::vector<int64_t>& boundaries, int64_t num_blocks) {
  bool ok = boundaries.size() >= 2 && boundaries.front() == 0 && boundaries.back() == num_blocks;
  for (size_t i = 1; ok && i < boundaries.size(); ++i) {
    ok = boundaries[i] > boundaries[i - 1];
  }
  return ok;
}

void check_segmentation(
    const std::vector<int64_t>& boundaries, int64_t num_blocks, const std::string& what) {
  if (!is_segmentation(boundaries, num_blocks)) {
    throw Error(fmt::format(
        "segment boundaries [{}] do not cut {} into non-empty segments; expected "
        "0 = b_0 < b_1 < ... < b_n = {}",
        fmt::join(boundaries, ", "),
        what,
        num_blocks));
  }
}

at::Tensor checkpoint_sequential(
    const torch::nn::Sequential& sequential,
    const std::vector<int64_t>& boundaries,
    at::Tensor input,
    bool preserve_rng_state) {
  const auto num_blocks = static_cast<int64_t>(sequential->size());
  check_segmentation(boundaries, num_blocks, fmt::format("{} blocks", num_blocks));
  auto run_blocks = [blocks = sequential.ptr()](int64_t begin, int64_t end, at::Tensor x) {
    for (int64_t k = begin; k < end; ++k) {
      x = (blocks->begin() + k)->forward<at::Tensor>(std::move(x));
    }
    return x;
  };
  for (size_t s = 0; s + 2 < boundaries.size(); ++s) {
    const int64_t begin = boundaries[s];
    const int64_t end = boundaries[s + 1];
    std::vector<std::shared_ptr<torch::nn::Module>> modules;
    for (int64_t k = begin; k < end; ++k) {
      modules.push_back(sequential->ptr(static_cast<size_t>(k)));
    }
    input = checkpoint_modules(
                modules,
                [run_blocks, begin, end](const std::vector<at::Tensor>& inputs) {
                  return std::vector<at::Tensor>{run_blocks(begin, end, inputs[0])};
                },
                {std::move(input)},
                preserve_rng_state)
                .front();
  }
  return run_blocks(boundaries[boundaries.size() - 2], num_blocks, std::move(input));
}

at::Tensor checkpoint_sequential(
    const torch::nn::Sequential& sequential,
    int64_t num_segments,
    at::Tensor input,
    bool preserve_rng_state) {
  return checkpoint_sequential(
      sequential,
      segment_boundaries_by_count(static_cast<int64_t>(sequential->size()), num_segments),
      std::move(input),
      preserve_rng_state);
}

int64_t current_recompute_id() {
  return recompute_id;
}

} // namespace largo::parallel
