// Pipeline schedules as pure functions: for every pipeline rank, the ordered list of what it
// does in one training step — forward and backward passes of micro-batches through its
// stages, and the sends and receives that move activations forward and gradients backward.
// The executor (pipeline_parallel.h) runs such a list; tests check the lists as arithmetic
// and simulate them (pipeline_simulation.h) for deadlocks, bubbles and memory.
//
// Vocabulary. The model is cut into S * V stages ("virtual stages"); S pipeline ranks each
// hold V of them, stage s on rank s % S (Megatron's interleaving: rank r holds stages r,
// r + S, r + 2S, ...). A step splits the batch into M micro-batches. Each micro-batch goes
// forward through stages 0 .. S*V-1 (F), then backward through them in reverse (B), or, for
// the zero-bubble schedule, through an input-gradient pass (I, on the critical path) and a
// weight-gradient pass (W, deferrable) per stage.
//
// Schedules (S ranks, M micro-batches; the bubble is the idle fraction with F + B costing
// the same everywhere, see pipeline_simulation.h):
//   gpipe             all M forwards, then all M backwards. Bubble (S-1)/(M+S-1); every
//                     rank keeps the activations of all M micro-batches.
//   1f1b              PipeDream-Flush: rank r runs S-1-r warm-up forwards, then alternates
//                     one forward and one backward. Same bubble; at most S-r micro-batches'
//                     activations alive on rank r.
//   interleaved_1f1b  Megatron's: V >= 2 stages per rank, M a multiple of S; bubble
//                     (S-1)/(V*M+S-1), about 1/V of 1f1b's, for V times the messages and
//                     some extra activation memory (warm-up of (S-r-1)*2 + (V-1)*S chunks).
//   zb_h1             Qi et al.'s ZB-H1: 1f1b with the backward split into I and W; rank r
//                     defers up to r weight passes and runs them where 1f1b idles, so the
//                     bubble is (S-1)(F+I-W) instead of (S-1)(F+I+W), and no rank keeps more
//                     than S micro-batches alive (1f1b's peak).
//
// Communication in the lists. After the compute action that produces a message comes its
// Send (asynchronous). The receiver posts the matching receive (PostRecv) one compute
// action before the one that needs it, so the transfer overlaps that compute, and waits for
// it (WaitRecv) just before. A send's buffer is released at its WaitSend, placed at the first
// point where the sender provably knows that the receiver has posted the receive (a
// happens-before argument over the lists themselves, vector clocks), so waiting never
// blocks on the peer: on Gloo a send completes only once the receive is posted. Every
// message of a step has its own tag (message_tag), so messages pair by tag whatever the
// order; the lists also issue, per ordered pair of ranks, the sends and the posted receives
// in the same order (what NCCL, which ignores tags, needs) — checked by validate_schedule.
//
// No collectives; nothing here touches tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace largo::parallel {

enum class PipelineScheduleKind { kGPipe, kOneFOneB, kInterleaved1F1B, kZeroBubbleH1 };

// "gpipe", "1f1b", "interleaved_1f1b", "zb_h1" (MODEL.PIPELINE.SCHEDULE).
std::string to_string(PipelineScheduleKind kind);
// Throws ConfigError naming the value and the valid names.
PipelineScheduleKind parse_pipeline_schedule(const std::string& name);

// The size of a pipelined step.
struct PipelineShape {
  int num_ranks = 1;        // S: pipeline ranks (DISTRIBUTED.PIPELINE_SIZE)
  int num_microbatches = 1; // M (MODEL.PIPELINE.NUM_MICROBATCHES)
  int virtual_stages = 1;   // V: stages per rank (MODEL.PIPELINE.VIRTUAL_STAGES)

  int num_stages() const {
    return num_ranks * virtual_stages;
  }
  int rank_of_stage(int stage) const {
    return stage % num_ranks;
  }
  // The stages pipeline rank `rank` holds, in order: rank, rank + S, ... (V of them).
  std::vector<int> stages_of_rank(int rank) const {
    std::vector<int> stages;
    for (int v = 0; v < virtual_stages; ++v) {
      stages.push_back(v * num_ranks + rank);
    }
    return stages;
  }
  // Which of its rank's stages `stage` is: 0 .. V-1.
  int local_index_of_stage(int stage) const {
    return stage / num_ranks;
  }
};

// Throws ConfigError (naming the option and value) unless the shape suits the schedule:
// S, M, V >= 1; V == 1 except for interleaved_1f1b, which needs S >= 2, V >= 2 and M a
// multiple of S.
void check_pipeline_shape(PipelineScheduleKind kind, const PipelineShape& shape);

struct PipelineMessage {
  enum class Kind { kActivation, kGradient };
  Kind kind = Kind::kActivation;
  int microbatch = 0;
  int from_stage = 0; // the stage whose pass produced it
  int to_stage = 0;   // the stage that consumes it (from_stage +- 1)

  bool operator==(const PipelineMessage& other) const {
    return kind == other.kind && microbatch == other.microbatch && from_stage == other.from_stage &&
           to_stage == other.to_stage;
  }
};

// A message's tag, unique within a step: ((kind * stages + from_stage) * M + microbatch).
int message_tag(const PipelineMessage& message, const PipelineShape& shape);

struct PipelineAction {
  enum class Kind {
    kForward,        // F(microbatch, stage)
    kBackward,       // B: input and weight gradients in one pass
    kBackwardInput,  // I: the input gradient only (zb_h1)
    kBackwardWeight, // W: the weight gradients (zb_h1)
    kSend,           // start sending `message`
    kWaitSend,       // wait until `message` has been sent; its buffer may then be freed
    kPostRecv,       // post the receive of `message`
    kWaitRecv,       // wait until `message` has arrived
  };
  Kind kind = Kind::kForward;
  int microbatch = 0;
  int stage = 0;             // compute actions: the stage run
  PipelineMessage message{}; // communication actions

  bool is_compute() const {
    return kind == Kind::kForward || kind == Kind::kBackward || kind == Kind::kBackwardInput ||
           kind == Kind::kBackwardWeight;
  }
  bool operator==(const PipelineAction& other) const;
};

using RankSchedule = std::vector<PipelineAction>;

// The compute actions of every rank, in order (index = pipeline rank). Throws ConfigError
// for a shape the schedule does not take (check_pipeline_shape).
std::vector<RankSchedule> compute_schedule(PipelineScheduleKind kind, const PipelineShape& shape);

// Adds the communication to compute-only lists (see the top of this file): Send after the
// producing pass, PostRecv one compute action early, WaitRecv just before the consumer,
// WaitSend where it cannot block.
std::vector<RankSchedule>
add_communication(const std::vector<RankSchedule>& compute, const PipelineShape& shape);

// compute_schedule then add_communication: what the executor runs.
std::vector<RankSchedule> pipeline_schedule(PipelineScheduleKind kind, const PipelineShape& shape);

// Throws largo::Error naming the rank, action and rule broken unless: each rank runs only its
// own stages; every (micro-batch, stage) has exactly one F and either one B or one I and one
// W, on its rank, with F before B/I before W; every message between stages on different
// ranks is sent once after its producing pass, posted and waited for once by its receiver
// (post before wait, wait before the consuming pass), and its send waited for once after the
// send; and per ordered pair of ranks the sends and the posted receives come in the same
// order. Deadlock freedom is simulate_schedule's.
void validate_schedule(const std::vector<RankSchedule>& schedule, const PipelineShape& shape);

// "F3@1" (forward of micro-batch 3 through stage 1), "Send(A3 1->2)": for messages.
std::string describe(const PipelineAction& action);

} // namespace largo::parallel
