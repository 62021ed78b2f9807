#include <largo/parallel/pipeline/pipeline_schedule.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

namespace largo::parallel {

using Kind = PipelineAction::Kind;
using MessageKind = PipelineMessage::Kind;

std::string to_string(PipelineScheduleKind kind) {
  switch (kind) {
  case PipelineScheduleKind::kGPipe:
    return "gpipe";
  case PipelineScheduleKind::kOneFOneB:
    return "1f1b";
  case PipelineScheduleKind::kInterleaved1F1B:
    return "interleaved_1f1b";
  case PipelineScheduleKind::kZeroBubbleH1:
    return "zb_h1";
  }
  return "?";
}

PipelineScheduleKind parse_pipeline_schedule(const std::string& name) {
  for (auto kind :
       {PipelineScheduleKind::kGPipe,
        PipelineScheduleKind::kOneFOneB,
        PipelineScheduleKind::kInterleaved1F1B,
        PipelineScheduleKind::kZeroBubbleH1}) {
    if (name == to_string(kind)) {
      return kind;
    }
  }
  throw ConfigError(
      fmt::format("pipeline schedule = {}: expected gpipe, 1f1b, interleaved_1f1b or zb_h1", name));
}

void check_pipeline_shape(PipelineScheduleKind kind, const PipelineShape& shape) {
  const int S = shape.num_ranks;
  const int M = shape.num_microbatches;
  const int V = shape.virtual_stages;
  if (S < 1 || M < 1 || V < 1) {
    throw ConfigError(fmt::format(
        "pipeline shape: ranks = {}, micro-batches (PipelineParallelOptions::num_microbatches) "
        "= {}, virtual stages (PipelineParallelOptions::virtual_stages) = {}: each must be >= 1",
        S,
        M,
        V));
  }
  if (kind != PipelineScheduleKind::kInterleaved1F1B) {
    if (V != 1) {
      throw ConfigError(fmt::format(
          "pipeline virtual stages (PipelineParallelOptions::virtual_stages) = {} with schedule "
          "{}: only "
          "interleaved_1f1b runs several stages per rank; set it to 1 or choose "
          "interleaved_1f1b",
          V,
          to_string(kind)));
    }
    return;
  }
  if (S < 2 || V < 2 || M % S != 0) {
    throw ConfigError(fmt::format(
        "schedule interleaved_1f1b with {} pipeline ranks, "
        "PipelineParallelOptions::virtual_stages = {} and "
        "PipelineParallelOptions::num_microbatches = {}: it needs >= 2 ranks, "
        "PipelineParallelOptions::virtual_stages >= 2 and a number of "
        "micro-batches that is a multiple of the pipeline size (e.g. {})",
        S,
        V,
        M,
        std::max(S, M - M % std::max(S, 1))));
  }
}

bool PipelineAction::operator==(const PipelineAction& other) const {
  if (kind != other.kind) {
    return false;
  }
  return is_compute() ? microbatch == other.microbatch && stage == other.stage
                      : message == other.message;
}

int message_tag(const PipelineMessage& message, const PipelineShape& shape) {
  const int kind = message.kind == MessageKind::kActivation ? 0 : 1;
  return (kind * shape.num_stages() + message.from_stage) * shape.num_microbatches +
         message.microbatch;
}

std::string describe(const PipelineAction& action) {
  const auto& m = action.message;
  const std::string message = fmt::format(
      "{}{} {}->{}",
      m.kind == MessageKind::kActivation ? "A" : "G",
      m.microbatch,
      m.from_stage,
      m.to_stage);
  switch (action.kind) {
  case Kind::kForward:
    return fmt::format("F{}@{}", action.microbatch, action.stage);
  case Kind::kBackward:
    return fmt::format("B{}@{}", action.microbatch, action.stage);
  case Kind::kBackwardInput:
    return fmt::format("I{}@{}", action.microbatch, action.stage);
  case Kind::kBackwardWeight:
    return fmt::format("W{}@{}", action.microbatch, action.stage);
  case Kind::kSend:
    return "Send(" + message + ")";
  case Kind::kWaitSend:
    return "WaitSend(" + message + ")";
  case Kind::kPostRecv:
    return "PostRecv(" + message + ")";
  case Kind::kWaitRecv:
    return "WaitRecv(" + message + ")";
  }
  return "?";
}

// ---- compute orders -------------------------------------------------------------------

namespace {

PipelineAction compute(Kind kind, int microbatch, int stage) {
  PipelineAction action;
  action.kind = kind;
  action.microbatch = microbatch;
  action.stage = stage;
  return action;
}

RankSchedule gpipe_rank(int rank, int M) {
  RankSchedule actions;
  for (int m = 0; m < M; ++m) {
    actions.push_back(compute(Kind::kForward, m, rank));
  }
  for (int m = 0; m < M; ++m) {
    actions.push_back(compute(Kind::kBackward, m, rank));
  }
  return actions;
}

// 1f1b, and zb_h1 when `split`: warm-up forwards, then one forward and one backward at a
// time, then the remaining backwards. zb_h1 defers up to `rank` weight passes (the later a
// stage, the longer it waits for its first gradient, the more W it holds back) and runs one
// after each input pass once that many are pending, and all the rest at the end.
RankSchedule one_f_one_b_rank(int rank, int S, int M, bool split) {
  const int warmup = std::min(S - 1 - rank, M);
  RankSchedule actions;
  int forward = 0, backward = 0, weight = 0;
  for (; forward < warmup; ++forward) {
    actions.push_back(compute(Kind::kForward, forward, rank));
  }
  auto backward_step = [&](bool cooldown) {
    if (!split) {
      actions.push_back(compute(Kind::kBackward, backward++, rank));
      return;
    }
    actions.push_back(compute(Kind::kBackwardInput, backward++, rank));
    if (cooldown || backward - weight > rank) {
      actions.push_back(compute(Kind::kBackwardWeight, weight++, rank));
    }
  };
  for (; forward < M; ++forward) {
    actions.push_back(compute(Kind::kForward, forward, rank));
    backward_step(false);
  }
  while (backward < M) {
    backward_step(true);
  }
  while (split && weight < M) {
    actions.push_back(compute(Kind::kBackwardWeight, weight++, rank));
  }
  return actions;
}

// Megatron's interleaved order: the k-th forward of a rank is micro-batch
// (k / (S*V)) * S + k % S through its local stage (k / S) % V; backwards run the local
// stages in reverse. Warm-up: (S - rank - 1) * 2 + (V - 1) * S forwards (all of them when
// M == S), then one forward and one backward at a time.
RankSchedule interleaved_rank(int rank, int S, int M, int V) {
  const int total = M * V;
  auto microbatch_of = [&](int k) { return (k / (S * V)) * S + k % S; };
  auto forward_stage = [&](int k) { return ((k / S) % V) * S + rank; };
  auto backward_stage = [&](int k) { return (V - 1 - (k / S) % V) * S + rank; };
  const int warmup = M == S ? total : std::min((S - rank - 1) * 2 + (V - 1) * S, total);
  RankSchedule actions;
  for (int k = 0; k < warmup; ++k) {
    actions.push_back(compute(Kind::kForward, microbatch_of(k), forward_stage(k)));
  }
  for (int k = 0; k < total - warmup; ++k) {
    actions.push_back(
        compute(Kind::kForward, microbatch_of(k + warmup), forward_stage(k + warmup)));
    actions.push_back(compute(Kind::kBackward, microbatch_of(k), backward_stage(k)));
  }
  for (int k = std::max(total - warmup, 0); k < total; ++k) {
    actions.push_back(compute(Kind::kBackward, microbatch_of(k), backward_stage(k)));
  }
  return actions;
}

} // namespace

std::vector<RankSchedule> compute_schedule(PipelineScheduleKind kind, const PipelineShape& shape) {
  check_pipeline_shape(kind, shape);
  const int S = shape.num_ranks;
  const int M = shape.num_microbatches;
  std::vector<RankSchedule> ranks;
  for (int rank = 0; rank < S; ++rank) {
    switch (kind) {
    case PipelineScheduleKind::kGPipe:
      ranks.push_back(gpipe_rank(rank, M));
      break;
    case PipelineScheduleKind::kOneFOneB:
      ranks.push_back(one_f_one_b_rank(rank, S, M, /*split=*/false));
      break;
    case PipelineScheduleKind::kZeroBubbleH1:
      ranks.push_back(one_f_one_b_rank(rank, S, M, /*split=*/true));
      break;
    case PipelineScheduleKind::kInterleaved1F1B:
      ranks.push_back(interleaved_rank(rank, S, M, shape.virtual_stages));
      break;
    }
  }
  return ranks;
}

// ---- communication ----------------------------------------------------------------------

namespace {

PipelineAction communication(Kind kind, const PipelineMessage& message) {
  PipelineAction action;
  action.kind = kind;
  action.microbatch = message.microbatch;
  action.message = message;
  return action;
}

// The message a compute action needs from another rank, if any.
std::optional<PipelineMessage>
needed_message(const PipelineAction& action, const PipelineShape& shape) {
  const int s = action.stage;
  const int rank = shape.rank_of_stage(s);
  if (action.kind == Kind::kForward && s > 0 && shape.rank_of_stage(s - 1) != rank) {
    return PipelineMessage{MessageKind::kActivation, action.microbatch, s - 1, s};
  }
  if ((action.kind == Kind::kBackward || action.kind == Kind::kBackwardInput) &&
      s + 1 < shape.num_stages() && shape.rank_of_stage(s + 1) != rank) {
    return PipelineMessage{MessageKind::kGradient, action.microbatch, s + 1, s};
  }
  return std::nullopt;
}

// The message a compute action produces for another rank, if any.
std::optional<PipelineMessage>
produced_message(const PipelineAction& action, const PipelineShape& shape) {
  const int s = action.stage;
  const int rank = shape.rank_of_stage(s);
  if (action.kind == Kind::kForward && s + 1 < shape.num_stages() &&
      shape.rank_of_stage(s + 1) != rank) {
    return PipelineMessage{MessageKind::kActivation, action.microbatch, s, s + 1};
  }
  if ((action.kind == Kind::kBackward || action.kind == Kind::kBackwardInput) && s > 0 &&
      shape.rank_of_stage(s - 1) != rank) {
    return PipelineMessage{MessageKind::kGradient, action.microbatch, s, s - 1};
  }
  return std::nullopt;
}

// Sends, posted and waited receives around one rank's compute actions (no WaitSend yet).
RankSchedule with_sends_and_receives(const RankSchedule& compute, const PipelineShape& shape) {
  RankSchedule actions;
  auto post = [&](size_t k) {
    if (k < compute.size()) {
      if (auto message = needed_message(compute[k], shape)) {
        actions.push_back(communication(Kind::kPostRecv, *message));
      }
    }
  };
  post(0);
  for (size_t k = 0; k < compute.size(); ++k) {
    post(k + 1);
    if (auto message = needed_message(compute[k], shape)) {
      actions.push_back(communication(Kind::kWaitRecv, *message));
    }
    actions.push_back(compute[k]);
    if (auto message = produced_message(compute[k], shape)) {
      actions.push_back(communication(Kind::kSend, *message));
    }
  }
  return actions;
}

// What each rank provably knows of the others' progress after each of its actions: a vector
// clock (entry j: how many of rank j's actions have happened before), advanced along each
// rank's list and merged at every WaitRecv with the sender's clock at its Send. Throws when
// the lists cannot run to the end (a receive whose send never comes).
std::vector<std::vector<std::vector<int>>>
vector_clocks(const std::vector<RankSchedule>& lists, const PipelineShape& shape) {
  const size_t S = lists.size();
  std::vector<std::vector<std::vector<int>>> clocks(S);
  std::vector<std::vector<int>> now(S, std::vector<int>(S, 0));
  std::map<int, std::vector<int>> sent; // tag -> the sender's clock at the send
  std::vector<size_t> next(S, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t r = 0; r < S; ++r) {
      while (next[r] < lists[r].size()) {
        const PipelineAction& action = lists[r][next[r]];
        const int tag = message_tag(action.message, shape);
        if (action.kind == Kind::kWaitRecv) {
          auto it = sent.find(tag);
          if (it == sent.end()) {
            break;
          }
          for (size_t j = 0; j < S; ++j) {
            now[r][j] = std::max(now[r][j], it->second[j]);
          }
        }
        now[r][r] = static_cast<int>(++next[r]);
        if (action.kind == Kind::kSend) {
          sent[tag] = now[r];
        }
        clocks[r].push_back(now[r]);
        progress = true;
      }
    }
  }
  for (size_t r = 0; r < S; ++r) {
    if (next[r] < lists[r].size()) {
      throw Error(fmt::format(
          "pipeline schedule deadlocks: rank {} waits forever at action {} "
          "({})",
          r,
          next[r],
          describe(lists[r][next[r]])));
    }
  }
  return clocks;
}

} // namespace

std::vector<RankSchedule>
add_communication(const std::vector<RankSchedule>& compute, const PipelineShape& shape) {
  std::vector<RankSchedule> lists;
  for (const auto& rank_compute : compute) {
    lists.push_back(with_sends_and_receives(rank_compute, shape));
  }
  const auto clocks = vector_clocks(lists, shape);
  std::map<int, int> posted_at; // tag -> index of its PostRecv in the receiver's list
  for (const auto& list : lists) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].kind == Kind::kPostRecv) {
        posted_at[message_tag(list[i].message, shape)] = static_cast<int>(i);
      }
    }
  }
  std::vector<RankSchedule> result(lists.size());
  for (size_t r = 0; r < lists.size(); ++r) {
    // waits_after[q]: the sends whose receive rank r knows to be posted once action q ran.
    std::vector<std::vector<PipelineMessage>> waits_after(lists[r].size() + 1);
    for (size_t i = 0; i < lists[r].size(); ++i) {
      const PipelineAction& action = lists[r][i];
      if (action.kind != Kind::kSend) {
        continue;
      }
      const size_t peer = static_cast<size_t>(shape.rank_of_stage(action.message.to_stage));
      const int post = posted_at.at(message_tag(action.message, shape));
      size_t q = i + 1;
      while (q < lists[r].size() && clocks[r][q][peer] <= post) {
        ++q;
      }
      waits_after[q].push_back(action.message); // q == size: at the end of the step
    }
    for (size_t q = 0; q <= lists[r].size(); ++q) {
      if (q < lists[r].size()) {
        result[r].push_back(lists[r][q]);
      }
      for (const auto& message : waits_after[q]) {
        result[r].push_back(communication(Kind::kWaitSend, message));
      }
    }
  }
  return result;
}

std::vector<RankSchedule> pipeline_schedule(PipelineScheduleKind kind, const PipelineShape& shape) {
  return add_communication(compute_schedule(kind, shape), shape);
}

// ---- validation ---------------------------------------------------------------------------

namespace {

// Where each pass and message event happened: (rank, index in its list), per key.
struct ScheduleIndex {
  std::map<std::pair<int, int>, std::map<Kind, int>> passes;   // (mb, stage) -> kind -> index
  std::map<int, std::map<Kind, std::pair<int, int>>> messages; // tag -> kind -> (rank, index)
};

[[noreturn]] void
broken(int rank, size_t index, const PipelineAction& action, const std::string& rule) {
  throw Error(fmt::format(
      "pipeline schedule: rank {} action {} ({}): {}", rank, index, describe(action), rule));
}

// Records one action, checking the rules that concern it alone and its predecessors.
void index_action(
    ScheduleIndex& index,
    int rank,
    size_t i,
    const PipelineAction& action,
    const PipelineShape& shape) {
  const int at = static_cast<int>(i);
  if (action.is_compute()) {
    if (action.stage < 0 || action.stage >= shape.num_stages() ||
        shape.rank_of_stage(action.stage) != rank || action.microbatch < 0 ||
        action.microbatch >= shape.num_microbatches) {
      broken(rank, i, action, "runs a stage or micro-batch that is not this rank's");
    }
    auto& seen = index.passes[{action.microbatch, action.stage}];
    if (seen.count(action.kind)) {
      broken(rank, i, action, "runs twice");
    }
    const bool backward = action.kind != Kind::kForward;
    if (backward && !seen.count(Kind::kForward)) {
      broken(rank, i, action, "comes before the forward of its micro-batch");
    }
    if (action.kind == Kind::kBackwardWeight && !seen.count(Kind::kBackwardInput)) {
      broken(rank, i, action, "comes before the input-gradient pass");
    }
    if (auto needed = needed_message(action, shape)) {
      auto& events = index.messages[message_tag(*needed, shape)];
      if (!events.count(Kind::kWaitRecv)) {
        broken(rank, i, action, "does not wait for the message it consumes first");
      }
    }
    seen[action.kind] = at;
    return;
  }
  const PipelineMessage& m = action.message;
  const bool activation = m.kind == MessageKind::kActivation;
  if (m.to_stage != m.from_stage + (activation ? 1 : -1) || m.from_stage < 0 || m.to_stage < 0 ||
      m.from_stage >= shape.num_stages() || m.to_stage >= shape.num_stages()) {
    broken(rank, i, action, "names stages that are not neighbours in the message's direction");
  }
  const bool sender_side = action.kind == Kind::kSend || action.kind == Kind::kWaitSend;
  if (shape.rank_of_stage(sender_side ? m.from_stage : m.to_stage) != rank) {
    broken(rank, i, action, "is on the wrong rank for this message");
  }
  auto& events = index.messages[message_tag(m, shape)];
  if (events.count(action.kind)) {
    broken(rank, i, action, "is issued twice");
  }
  const auto& producer = index.passes[{m.microbatch, m.from_stage}];
  if (action.kind == Kind::kSend &&
      !(activation ? producer.count(Kind::kForward)
                   : producer.count(Kind::kBackward) || producer.count(Kind::kBackwardInput))) {
    broken(rank, i, action, "is sent before the pass that produces it");
  }
  if (action.kind == Kind::kWaitSend && !events.count(Kind::kSend)) {
    broken(rank, i, action, "waits for a send not yet started");
  }
  if (action.kind == Kind::kWaitRecv && !events.count(Kind::kPostRecv)) {
    broken(rank, i, action, "waits for a receive not yet posted");
  }
  events[action.kind] = {rank, at};
}

// Every pass ran and every message made its four events.
void check_complete(const ScheduleIndex& index, const PipelineShape& shape) {
  for (int mb = 0; mb < shape.num_microbatches; ++mb) {
    for (int stage = 0; stage < shape.num_stages(); ++stage) {
      auto it = index.passes.find({mb, stage});
      const bool full = it != index.passes.end() && it->second.count(Kind::kForward) &&
                        (it->second.count(Kind::kBackward) != 0) !=
                            (it->second.count(Kind::kBackwardInput) != 0 &&
                             it->second.count(Kind::kBackwardWeight) != 0);
      if (!full) {
        throw Error(fmt::format(
            "pipeline schedule: micro-batch {} at stage {} (rank {}) lacks a "
            "forward or a backward (B, or both I and W)",
            mb,
            stage,
            shape.rank_of_stage(stage)));
      }
    }
  }
  for (const auto& [tag, events] : index.messages) {
    if (events.size() != 4) {
      throw Error(fmt::format(
          "pipeline schedule: message tag {} has {} of its 4 events (Send, "
          "WaitSend, PostRecv, WaitRecv)",
          tag,
          events.size()));
    }
  }
}

// Per ordered pair of ranks, the sends and the posted receives come in the same order.
void check_channel_order(const std::vector<RankSchedule>& schedule, const PipelineShape& shape) {
  std::map<std::pair<int, int>, std::vector<int>> sends, posts;
  for (size_t r = 0; r < schedule.size(); ++r) {
    for (const auto& action : schedule[r]) {
      const int from = shape.rank_of_stage(action.message.from_stage);
      const int to = shape.rank_of_stage(action.message.to_stage);
      if (action.kind == Kind::kSend) {
        sends[{from, to}].push_back(message_tag(action.message, shape));
      } else if (action.kind == Kind::kPostRecv) {
        posts[{from, to}].push_back(message_tag(action.message, shape));
      }
    }
  }
  for (const auto& [channel, tags] : sends) {
    if (posts[channel] != tags) {
      throw Error(fmt::format(
          "pipeline schedule: rank {} sends to rank {} in another order than "
          "rank {} posts the receives",
          channel.first,
          channel.second,
          channel.second));
    }
  }
}

} // namespace

void validate_schedule(const std::vector<RankSchedule>& schedule, const PipelineShape& shape) {
  if (static_cast<int>(schedule.size()) != shape.num_ranks) {
    throw Error(fmt::format(
        "pipeline schedule: {} ranks' lists for a pipeline of {} ranks",
        schedule.size(),
        shape.num_ranks));
  }
  ScheduleIndex index;
  // Each rank's rules are checked along its own list; the pairing of a message's events
  // across ranks by the completeness and channel-order checks after.
  for (size_t r = 0; r < schedule.size(); ++r) {
    for (size_t i = 0; i < schedule[r].size(); ++i) {
      index_action(index, static_cast<int>(r), i, schedule[r][i], shape);
    }
  }
  check_complete(index, shape);
  check_channel_order(schedule, shape);
}

} // namespace largo::parallel
