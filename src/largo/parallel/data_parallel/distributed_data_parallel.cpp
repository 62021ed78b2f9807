#include <largo/parallel/data_parallel/distributed_data_parallel.h>

#include "bucket_launch_order.h"

#include <largo/core/error.h>
#include <largo/parallel/data_parallel/grad_ready_hooks.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

namespace largo::parallel {
namespace {

int64_t bytes_of(const at::Tensor& tensor) {
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

} // namespace

void broadcast_coalesced(comm::ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                         int root) {
  if (group.world_size() == 1 || tensors.empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  // One flat tensor per (dtype, device), in first-appearance order so every rank groups alike.
  std::vector<std::vector<at::Tensor>> groups;
  std::map<std::pair<at::ScalarType, std::string>, size_t> group_of;
  for (const at::Tensor& tensor : tensors) {
    auto key = std::make_pair(tensor.scalar_type(), tensor.device().str());
    auto [it, inserted] = group_of.emplace(key, groups.size());
    if (inserted) {
      groups.emplace_back();
    }
    groups[it->second].push_back(tensor);
  }
  for (auto& members : groups) {
    std::vector<at::Tensor> flat_views;
    for (const at::Tensor& tensor : members) {
      flat_views.push_back(tensor.reshape({-1}));
    }
    at::Tensor flat = at::cat(flat_views);
    group.broadcast(flat, root);
    if (group.rank() == root) {
      continue;
    }
    int64_t offset = 0;
    for (const at::Tensor& tensor : members) {
      const_cast<at::Tensor&>(tensor).copy_(flat.narrow(0, offset, tensor.numel()).view_as(tensor));
      offset += tensor.numel();
    }
  }
}

// ---- the reducer: buckets, and what happens as gradients become ready ---------------

struct DistributedDataParallel::Reducer {
  struct ParamSlot {
    at::Tensor param;
    std::string name;
    size_t bucket = 0;
    at::Tensor grad_view; // this parameter's part of its bucket, shaped like the parameter
    bool ready = false;   // its gradient arrived in the current synchronized backward
  };
  struct Bucket {
    at::Tensor buffer; // flat gradients of its parameters, [numel]
    std::vector<size_t> params;
    size_t pending = 0; // parameters not ready yet in the current backward
    bool launched = false;
    comm::Work work;
  };

  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<comm::ProcessGroup> group;
  DistributedDataParallelOptions options;
  std::vector<ParamSlot> params;
  std::vector<Bucket> buckets;
  std::vector<at::Tensor> buffers;
  std::unique_ptr<GradReadyHooks> hooks; // absent with manual_reduction

  std::mutex mutex; // hooks run on the autograd engine's threads
  bool require_sync = true;
  size_t next_bucket = 0; // buckets launch in index order on every rank

  void build_buckets();
  void register_hooks();
  void ensure_grad_is_view(ParamSlot& slot);
  void on_grad_ready(size_t index);
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void finish_backward();
  void reset_for_next_backward();
};

void DistributedDataParallel::Reducer::build_buckets() {
  // Parameters in reverse registration order: roughly the order backward produces them.
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) {
      named.emplace_back(item.key(), item.value());
    }
  }
  std::reverse(named.begin(), named.end());

  // One open bucket per (dtype, device); a bucket closes when it reaches its cap.
  std::map<std::pair<at::ScalarType, std::string>, size_t> open_bucket;
  std::vector<int64_t> bucket_bytes;
  for (auto& [name, param] : named) {
    auto key = std::make_pair(param.scalar_type(), param.device().str());
    auto it = open_bucket.find(key);
    if (it == open_bucket.end()) {
      it = open_bucket.emplace(key, buckets.size()).first;
      buckets.emplace_back();
      bucket_bytes.push_back(0);
    }
    const size_t b = it->second;
    buckets[b].params.push_back(params.size());
    bucket_bytes[b] += bytes_of(param);
    ParamSlot slot;
    slot.param = param;
    slot.name = name;
    slot.bucket = b;
    params.push_back(std::move(slot));
    const int64_t cap = b == 0 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
    if (bucket_bytes[b] >= cap) {
      open_bucket.erase(it);
    }
  }
  for (Bucket& bucket : buckets) {
    const at::Tensor& first = params[bucket.params.front()].param;
    int64_t numel = 0;
    for (size_t index : bucket.params) {
      numel += params[index].param.numel();
    }
    bucket.buffer = at::zeros({numel}, first.options());
    int64_t offset = 0;
    for (size_t index : bucket.params) {
      ParamSlot& slot = params[index];
      // Strided like the parameter (a channels-last weight too), as PyTorch's DDP lays its
      // bucket views: the gradients autograd accumulates there keep the weight's layout.
      const at::Tensor piece = bucket.buffer.narrow(0, offset, slot.param.numel());
      slot.grad_view = slot.param.is_non_overlapping_and_dense()
                           ? piece.as_strided(slot.param.sizes(), slot.param.strides())
                           : piece.view(slot.param.sizes());
      offset += slot.param.numel();
    }
    bucket.pending = bucket.params.size();
  }
}

void DistributedDataParallel::Reducer::register_hooks() {
  std::vector<at::Tensor> tensors;
  for (const ParamSlot& slot : params) {
    tensors.push_back(slot.param);
  }
  // The hooks die with the reducer, so they may point at it.
  hooks = std::make_unique<GradReadyHooks>(
      tensors, [this](size_t index) { on_grad_ready(index); }, [this] { finish_backward(); });
}

// Keeps .grad a view of the bucket: after zero_grad(set_to_none) the accumulator stores a
// fresh tensor, which is copied in once; later accumulation then happens in place.
void DistributedDataParallel::Reducer::ensure_grad_is_view(ParamSlot& slot) {
  at::Tensor& grad = slot.param.mutable_grad();
  if (grad.defined() && grad.data_ptr() == slot.grad_view.data_ptr()) {
    return;
  }
  torch::NoGradGuard no_grad;
  if (grad.defined()) {
    slot.grad_view.copy_(grad);
  } else {
    slot.grad_view.zero_();
  }
  grad = slot.grad_view;
}

void DistributedDataParallel::Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex);
  ParamSlot& slot = params[index];
  ensure_grad_is_view(slot);
  if (!require_sync) {
    return; // no_sync(): accumulate locally only
  }
  if (slot.ready) {
    reset_for_next_backward();
    throw TrainingError(fmt::format(
        "DistributedDataParallel: parameter '{}' received its gradient twice in one backward "
        "pass. A parameter may be used several times in a forward, but backward must reach its "
        "gradient accumulator once; this happens with reentrant activation checkpointing or a "
        "module run in two separate graphs. Use Largo's activation checkpointing, or "
        "DistributedDataParallelOptions::manual_reduction = true",
        slot.name));
  }
  slot.ready = true;
  Bucket& bucket = buckets[slot.bucket];
  if (--bucket.pending == 0 && !options.delay_allreduce) {
    launch_ready_buckets();
  }
}

void DistributedDataParallel::Reducer::launch_ready_buckets() {
  detail::launch_ready_buckets_in_order(
      buckets, next_bucket, [this](Bucket& bucket) { launch(bucket); });
}

void DistributedDataParallel::Reducer::launch(Bucket& bucket) {
  // Divided before the sum (as PyTorch does), so large gradients do not overflow low
  // precision; exact for a power-of-two world size.
  torch::NoGradGuard no_grad;
  bucket.buffer.div_(group->world_size());
  bucket.work = group->all_reduce_async(bucket.buffer);
  bucket.launched = true;
}

void DistributedDataParallel::Reducer::finish_backward() {
  std::lock_guard<std::mutex> lock(mutex);
  if (!require_sync) {
    return; // a no_sync() backward: nothing was launched
  }
  std::vector<std::string> missing;
  for (ParamSlot& slot : params) {
    if (slot.ready) {
      continue;
    }
    if (!options.find_unused_parameters) {
      missing.push_back(slot.name);
      continue;
    }
    // Unused in this backward: its gradient counts as zero (or as what earlier no_sync
    // micro-steps accumulated in its bucket view).
    ensure_grad_is_view(slot);
    slot.ready = true;
    --buckets[slot.bucket].pending;
  }
  if (!missing.empty()) {
    // Wait for what was launched so no collective is left half-done on this rank, then stop.
    for (Bucket& bucket : buckets) {
      if (bucket.launched) {
        bucket.work.wait();
      }
    }
    reset_for_next_backward();
    const size_t shown = std::min<size_t>(missing.size(), 8);
    throw TrainingError(fmt::format(
        "DistributedDataParallel: {} parameter(s) received no gradient in this backward pass "
        "({}{}). Every rank would wait for them forever. If the model really leaves them "
        "unused, construct DistributedDataParallel with find_unused_parameters = true; if they "
        "should be trained, check that the forward uses them",
        missing.size(),
        fmt::join(std::vector<std::string>(missing.begin(), missing.begin() + shown), ", "),
        missing.size() > shown ? ", ..." : ""));
  }
  launch_ready_buckets();
  for (Bucket& bucket : buckets) {
    TORCH_INTERNAL_ASSERT(bucket.launched, "DDP: a bucket was not launched");
    bucket.work.wait();
  }
  reset_for_next_backward();
}

void DistributedDataParallel::Reducer::reset_for_next_backward() {
  for (ParamSlot& slot : params) {
    slot.ready = false;
  }
  for (Bucket& bucket : buckets) {
    bucket.pending = bucket.params.size();
    bucket.launched = false;
    bucket.work = comm::Work();
  }
  next_bucket = 0;
}

// ---- DistributedDataParallel --------------------------------------------------------

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<comm::ProcessGroup> group,
                                                 DistributedDataParallelOptions options)
    : reducer_(std::make_unique<Reducer>()) {
  TORCH_CHECK(module != nullptr && group != nullptr,
              "DistributedDataParallel needs a module and a process group");
  if (options.bucket_cap_bytes <= 0 || options.first_bucket_cap_bytes <= 0) {
    throw ConfigError(fmt::format(
        "DistributedDataParallelOptions::bucket_cap_bytes must be > 0 (bucket cap {} bytes, "
        "first bucket {} bytes)",
        options.bucket_cap_bytes,
        options.first_bucket_cap_bytes));
  }
  reducer_->module = std::move(module);
  reducer_->group = std::move(group);
  reducer_->options = options;
  for (const auto& buffer : reducer_->module->buffers(/*recurse=*/true)) {
    reducer_->buffers.push_back(buffer);
  }

  // Every rank starts from rank 0's model.
  std::vector<at::Tensor> state;
  for (const auto& param : reducer_->module->parameters(/*recurse=*/true)) {
    state.push_back(param);
  }
  state.insert(state.end(), reducer_->buffers.begin(), reducer_->buffers.end());
  broadcast_coalesced(*reducer_->group, state, /*root=*/0);

  reducer_->build_buckets();
  if (!reducer_->options.manual_reduction) {
    reducer_->register_hooks();
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::before_forward() {
  Reducer& r = *reducer_;
  if (r.options.broadcast_buffers && r.group->world_size() > 1 && !r.buffers.empty()) {
    broadcast_coalesced(*r.group, r.buffers, /*root=*/0);
  }
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->require_sync) {
  ddp_.reducer_->require_sync = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  ddp_.reducer_->require_sync = previous_;
}

void DistributedDataParallel::reduce_gradients() {
  Reducer& r = *reducer_;
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& slot : r.params) {
    r.ensure_grad_is_view(slot);
  }
  for (auto& bucket : r.buckets) {
    r.launch(bucket);
  }
  for (auto& bucket : r.buckets) {
    bucket.work.wait();
  }
  r.reset_for_next_backward();
}

void DistributedDataParallel::zero_grad() {
  Reducer& r = *reducer_;
  torch::NoGradGuard no_grad;
  for (auto& bucket : r.buckets) {
    bucket.buffer.zero_();
  }
  for (auto& slot : r.params) {
    slot.param.mutable_grad() = slot.grad_view;
  }
}

const std::shared_ptr<torch::nn::Module>& DistributedDataParallel::module() const {
  return reducer_->module;
}

comm::ProcessGroup& DistributedDataParallel::process_group() const {
  return *reducer_->group;
}

const DistributedDataParallelOptions& DistributedDataParallel::options() const {
  return reducer_->options;
}

int64_t DistributedDataParallel::num_buckets() const {
  return static_cast<int64_t>(reducer_->buckets.size());
}

int64_t DistributedDataParallel::gradient_bucket_bytes() const {
  int64_t total = 0;
  for (const auto& bucket : reducer_->buckets) {
    total += bytes_of(bucket.buffer);
  }
  return total;
}

} // namespace largo::parallel
