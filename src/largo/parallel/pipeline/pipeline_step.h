// Private to PipelineParallel: one step of one pipeline rank — runs the rank's list of a
// schedule (pipeline_schedule.h), moving tensors between stages with the pipeline group's
// point-to-point calls. See pipeline_parallel.h for the contract.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>
#include <largo/parallel/pipeline/pipeline_schedule.h>
#include <largo/parallel/pipeline/pipeline_split_backward.h>
#include <largo/parallel/pipeline/pipeline_stages.h>

#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace largo::parallel {

// What a step needs from the pipeline that owns it.
struct PipelineStepContext {
  PipelineShape shape;
  int rank = 0;                                          // pipeline rank
  std::vector<PipelineStage> stages;                     // this rank's stages, by local index
  std::vector<std::vector<at::Tensor>> stage_parameters; // by local index
  comm::ProcessGroup* group = nullptr;
  at::Device device = at::kCPU; // where the stages' parameters live: messages land there
  bool checkpoint_stages = false;
};

class PipelineStep {
 public:
  // forward_only: no gradients; the last stage keeps the outputs (outputs()).
  PipelineStep(
      const PipelineStepContext& context,
      const at::Tensor& inputs,
      const at::Tensor& targets,
      const PipelineParallel::LossFunction* loss,
      const PipelineParallel::LossScaling* scale_loss,
      bool forward_only);

  // Runs every action of this rank's list, then waits for the sends still in flight.
  void run(const RankSchedule& actions);

  // The sum over micro-batches of size_i / batch * loss_i (last stage; 0 elsewhere).
  double weighted_loss_sum() const {
    return loss_sum_;
  }
  // forward_only, last stage: the outputs for the whole batch, micro-batches concatenated.
  at::Tensor outputs() const;
  double busy_seconds() const {
    return busy_seconds_;
  }

 private:
  // One (stage, micro-batch)'s tensors between its forward and its backward.
  struct Slot {
    at::Tensor input;
    at::Tensor output; // the stage's output, or the last stage's scaled loss
    at::Tensor input_grad;
    std::optional<SplitBackward> split;
  };
  struct Transfer {
    comm::Work work;
    at::Tensor tensor;
    bool posted = false;
  };
  // The header a stage receives before its first activation of the step.
  struct Header {
    comm::Work work;
    at::Tensor data; // int64 [kHeaderLength]
    bool posted = false;
    bool read = false;
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> sample_shape; // an activation's shape without the batch dimension
  };

  void forward(const PipelineAction& action);
  void backward(const PipelineAction& action);
  void send(const PipelineMessage& message);
  void post_receive(const PipelineMessage& message);
  at::Tensor wait_receive(const PipelineMessage& message);
  void wait_send(const PipelineMessage& message);
  void set_batch_size(int64_t batch_size, const char* from);
  bool post_if_shape_known(const PipelineMessage& message, Transfer& transfer);
  void read_header(int stage);
  void wait_named(comm::Work& work, const PipelineMessage& message, bool sending);
  // Runs `communicate`, turning a CommError into one that names both stages and the peer's
  // job rank (a dead stage is then named by its neighbours).
  void with_stage_names(
      const PipelineMessage& message, bool sending, const std::function<void()>& communicate);
  at::Tensor run_stage(int stage, const at::Tensor& input);
  bool is_last_stage(int stage) const {
    return stage == context_.shape.num_stages() - 1;
  }

  const PipelineStepContext& context_;
  const PipelineParallel::LossFunction* loss_;
  const PipelineParallel::LossScaling* scale_loss_;
  bool forward_only_;
  int64_t batch_size_ = -1;
  std::vector<int64_t> microbatch_sizes_;
  at::Tensor inputs_, targets_;
  std::map<std::pair<int, int>, Slot> slots_; // (stage, micro-batch)
  std::map<int, Transfer> receives_, sends_;  // by message tag
  std::map<int, Header> headers_;             // by receiving stage
  std::vector<comm::Work> header_sends_;
  std::vector<bool> header_sent_;   // by sending stage
  std::vector<at::Tensor> outputs_; // forward_only, last stage, by micro-batch
  double loss_sum_ = 0.0;
  double busy_seconds_ = 0.0;
};

} // namespace largo::parallel
