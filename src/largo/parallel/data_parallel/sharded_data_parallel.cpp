#include <largo/parallel/data_parallel/sharded_data_parallel.h>

#include "bucket_launch_order.h"

#include <largo/core/error.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/grad_ready_hooks.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <deque>
#include <mutex>

namespace largo::parallel {

struct ShardedDataParallel::Reducer {
  // A trained parameter: where it lies in the optimizer's flat buffers.
  struct Member {
    size_t buffer = 0;
    size_t tensor_index = 0;
    size_t bucket = 0;
    bool ready = false;
  };
  // A range of one flat buffer, reduced to its owners in one go.
  struct Bucket {
    size_t buffer = 0;
    int64_t flat_begin = 0;
    int64_t flat_end = 0;
    std::vector<size_t> members;
    size_t pending = 0;
    at::Tensor data; // [flat_end - flat_begin] while in flight
    std::vector<comm::Work> works;
  };

  std::shared_ptr<torch::nn::Module> module;
  ShardedOptimizer* optimizer = nullptr;
  std::shared_ptr<comm::ProcessGroup> group;
  ShardedDataParallelOptions options;
  std::vector<Member> members;
  std::vector<Bucket> buckets;
  std::vector<at::Tensor> buffers;
  std::unique_ptr<GradReadyHooks> hooks;
  std::mutex mutex;
  size_t next_bucket = 0;     // buckets launch in index order on every rank
  std::deque<size_t> in_flight;

  ShardedOptimizer::FlatBuffer& flat(size_t buffer) {
    return optimizer->flat_buffers()[buffer];
  }
  void build_buckets();
  void on_grad_ready(size_t index);
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void complete(Bucket& bucket);
  void finish_backward();
};

void ShardedDataParallel::Reducer::build_buckets() {
  auto& flat_buffers = optimizer->flat_buffers();
  std::vector<std::vector<size_t>> member_of(flat_buffers.size());
  for (size_t b = 0; b < flat_buffers.size(); ++b) {
    for (size_t t = 0; t < flat_buffers[b].tensors.size(); ++t) {
      member_of[b].push_back(members.size());
      members.push_back({b, t});
    }
  }
  // Backward produces gradients roughly in reverse order of the parameters: buckets take
  // consecutive parameters of each buffer from its end.
  for (size_t b = 0; b < flat_buffers.size(); ++b) {
    const FlatLayout& layout = flat_buffers[b].layout;
    const int64_t element_size = flat_buffers[b].params.element_size();
    for (size_t t = layout.num_tensors(); t-- > 0;) {
      const bool start_new = buckets.empty() || buckets.back().buffer != b ||
          (buckets.back().flat_end - buckets.back().flat_begin) * element_size >=
              options.reduce_buffer_bytes;
      if (start_new) {
        Bucket bucket;
        bucket.buffer = b;
        bucket.flat_end = layout.offset(t) + layout.numel(t);
        buckets.push_back(bucket);
      }
      Bucket& bucket = buckets.back();
      bucket.flat_begin = layout.offset(t);
      bucket.members.push_back(member_of[b][t]);
      members[member_of[b][t]].bucket = buckets.size() - 1;
    }
  }
  for (Bucket& bucket : buckets) {
    bucket.pending = bucket.members.size();
  }
}

void ShardedDataParallel::Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex);
  Member& member = members[index];
  if (member.ready) {
    throw TrainingError(fmt::format(
        "ShardedDataParallel: parameter '{}' received its gradient twice in one backward pass; "
        "backward must reach each parameter's gradient accumulator once (use Largo's "
        "activation checkpointing, not a reentrant one)",
        flat(member.buffer).names[member.tensor_index]));
  }
  member.ready = true;
  if (--buckets[member.bucket].pending == 0) {
    launch_ready_buckets();
  }
}

void ShardedDataParallel::Reducer::launch_ready_buckets() {
  detail::launch_ready_buckets_in_order(
      buckets, next_bucket, [this](Bucket& bucket) { launch(bucket); });
}

void ShardedDataParallel::Reducer::launch(Bucket& bucket) {
  // Bounded memory: at most two buckets in flight.
  while (in_flight.size() >= 2) {
    complete(buckets[in_flight.front()]);
    in_flight.pop_front();
  }
  torch::NoGradGuard no_grad;
  ShardedOptimizer::FlatBuffer& buffer = flat(bucket.buffer);
  bucket.data = at::empty({bucket.flat_end - bucket.flat_begin}, buffer.params.options());
  for (size_t index : bucket.members) {
    const Member& member = members[index];
    at::Tensor& grad = buffer.tensors[member.tensor_index].mutable_grad();
    at::Tensor slot = bucket.data.narrow(0, buffer.layout.offset(member.tensor_index) - bucket.flat_begin,
                                         buffer.layout.numel(member.tensor_index));
    if (grad.defined()) {
      slot.copy_(grad.reshape({-1}));
      grad.reset(); // nobody keeps a full gradient: only the owner's shard survives
    } else {
      slot.zero_(); // an unused parameter (find_unused_parameters)
    }
  }
  bucket.data.div_(group->world_size());
  const int64_t shard = buffer.layout.shard_numel();
  for (int64_t owner = bucket.flat_begin / shard;
       owner < group->world_size() && owner * shard < bucket.flat_end; ++owner) {
    const int64_t begin = std::max(bucket.flat_begin, owner * shard);
    const int64_t end = std::min(bucket.flat_end, (owner + 1) * shard);
    bucket.works.push_back(group->reduce_async(bucket.data.narrow(0, begin - bucket.flat_begin, end - begin),
                                               static_cast<int>(owner)));
  }
  in_flight.push_back(static_cast<size_t>(&bucket - buckets.data()));
}

void ShardedDataParallel::Reducer::complete(Bucket& bucket) {
  for (comm::Work& work : bucket.works) {
    work.wait();
  }
  bucket.works.clear();
  torch::NoGradGuard no_grad;
  ShardedOptimizer::FlatBuffer& buffer = flat(bucket.buffer);
  const int64_t shard = buffer.layout.shard_numel();
  const int64_t shard_begin = group->rank() * shard;
  const int64_t begin = std::max(bucket.flat_begin, shard_begin);
  const int64_t end = std::min(bucket.flat_end, shard_begin + shard);
  if (end > begin) {
    buffer.grad_shard.narrow(0, begin - shard_begin, end - begin)
        .add_(bucket.data.narrow(0, begin - bucket.flat_begin, end - begin));
  }
  bucket.data = at::Tensor();
}

void ShardedDataParallel::Reducer::finish_backward() {
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<std::string> missing;
  for (Member& member : members) {
    if (member.ready) {
      continue;
    }
    if (!options.find_unused_parameters) {
      missing.push_back(flat(member.buffer).names[member.tensor_index]);
      continue;
    }
    member.ready = true;
    --buckets[member.bucket].pending;
  }
  auto reset = [&] {
    for (Member& member : members) {
      member.ready = false;
    }
    for (Bucket& bucket : buckets) {
      bucket.pending = bucket.members.size();
    }
    next_bucket = 0;
  };
  if (!missing.empty()) {
    while (!in_flight.empty()) {
      complete(buckets[in_flight.front()]);
      in_flight.pop_front();
    }
    reset();
    const size_t shown = std::min<size_t>(missing.size(), 8);
    throw TrainingError(fmt::format(
        "ShardedDataParallel: {} parameter(s) received no gradient in this backward pass ({}{}); "
        "set ShardedDataParallelOptions::find_unused_parameters = true if the model really "
        "leaves them unused",
        missing.size(),
        fmt::join(std::vector<std::string>(missing.begin(), missing.begin() + shown), ", "),
        missing.size() > shown ? ", ..." : ""));
  }
  launch_ready_buckets();
  while (!in_flight.empty()) {
    complete(buckets[in_flight.front()]);
    in_flight.pop_front();
  }
  reset();
}

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                         ShardedOptimizer& optimizer,
                                         std::shared_ptr<comm::ProcessGroup> group,
                                         ShardedDataParallelOptions options)
    : reducer_(std::make_unique<Reducer>()) {
  if (options.reduce_buffer_bytes <= 0) {
    throw ConfigError(fmt::format(
        "ShardedDataParallelOptions::reduce_buffer_bytes must be > 0, got {} bytes",
        options.reduce_buffer_bytes));
  }
  Reducer& r = *reducer_;
  r.module = std::move(module);
  r.optimizer = &optimizer;
  r.group = std::move(group);
  r.options = options;
  for (const auto& buffer : r.module->buffers(/*recurse=*/true)) {
    r.buffers.push_back(buffer);
  }
  std::vector<at::Tensor> state;
  for (const auto& param : r.module->parameters(/*recurse=*/true)) {
    state.push_back(param);
  }
  state.insert(state.end(), r.buffers.begin(), r.buffers.end());
  broadcast_coalesced(*r.group, state, /*root=*/0);

  optimizer.use_gradient_shards();
  r.build_buckets();
  std::vector<at::Tensor> params;
  for (const auto& member : r.members) {
    params.push_back(r.flat(member.buffer).tensors[member.tensor_index]);
  }
  r.hooks = std::make_unique<GradReadyHooks>(
      params, [&r](size_t index) { r.on_grad_ready(index); }, [&r] { r.finish_backward(); });
}

ShardedDataParallel::~ShardedDataParallel() = default;

void ShardedDataParallel::before_forward() {
  Reducer& r = *reducer_;
  if (r.options.broadcast_buffers && r.group->world_size() > 1 && !r.buffers.empty()) {
    broadcast_coalesced(*r.group, r.buffers, /*root=*/0);
  }
}

int64_t ShardedDataParallel::num_buckets() const {
  return static_cast<int64_t>(reducer_->buckets.size());
}

} // namespace largo::parallel
