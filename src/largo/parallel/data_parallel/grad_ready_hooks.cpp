#include <largo/parallel/data_parallel/grad_ready_hooks.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>

namespace largo::parallel {

struct GradReadyHooks::State : std::enable_shared_from_this<State> {
  std::function<void(size_t)> on_ready;
  std::function<void()> on_backward_end;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;
  std::mutex mutex;
  bool end_queued = false; // on_backward_end is queued for the running backward

  void ready(size_t index) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!end_queued) {
        end_queued = true;
        std::weak_ptr<State> self = shared_from_this();
        torch::autograd::Engine::get_default_engine().queue_callback([self] {
          if (auto state = self.lock()) {
            {
              std::lock_guard<std::mutex> inner(state->mutex);
              state->end_queued = false;
            }
            state->on_backward_end();
          }
        });
      }
    }
    on_ready(index);
  }
};

namespace {

class PostHook : public torch::autograd::FunctionPostHook {
 public:
  explicit PostHook(std::function<void()> callback) : callback_(std::move(callback)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    callback_();
    return outputs;
  }

 private:
  std::function<void()> callback_;
};

} // namespace

GradReadyHooks::GradReadyHooks(const std::vector<at::Tensor>& params,
                               std::function<void(size_t)> on_ready,
                               std::function<void()> on_backward_end)
    : state_(std::make_shared<State>()) {
  state_->on_ready = std::move(on_ready);
  state_->on_backward_end = std::move(on_backward_end);
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params[i]);
    state_->hook_keys.push_back(accumulator->add_post_hook(std::make_unique<PostHook>([weak, i] {
      if (auto state = weak.lock()) {
        state->ready(i);
      }
    })));
    state_->accumulators.push_back(std::move(accumulator));
  }
}

GradReadyHooks::~GradReadyHooks() {
  for (size_t i = 0; i < state_->accumulators.size(); ++i) {
    state_->accumulators[i]->del_post_hook(state_->hook_keys[i]);
  }
}

} // namespace largo::parallel
