#include <largo/parallel/pipeline/pipeline_simulation.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace largo::parallel {

using Kind = PipelineAction::Kind;

std::vector<double> PipelineSimulation::idle_fractions() const {
  std::vector<double> idle;
  for (double b : busy) {
    idle.push_back(makespan > 0.0 ? 1.0 - b / makespan : 0.0);
  }
  return idle;
}

double PipelineSimulation::mean_idle_fraction() const {
  const auto idle = idle_fractions();
  double sum = 0.0;
  for (double i : idle) {
    sum += i;
  }
  return idle.empty() ? 0.0 : sum / static_cast<double>(idle.size());
}

namespace {

double pass_cost(Kind kind, const PipelinePassCosts& costs, int virtual_stages) {
  double cost = 0.0;
  switch (kind) {
  case Kind::kForward:
    cost = costs.forward;
    break;
  case Kind::kBackward:
    cost = costs.backward_input + costs.backward_weight;
    break;
  case Kind::kBackwardInput:
    cost = costs.backward_input;
    break;
  case Kind::kBackwardWeight:
    cost = costs.backward_weight;
    break;
  default:
    break;
  }
  return cost / virtual_stages;
}

// One rank's progress through its list.
struct RankState {
  size_t next = 0;
  double time = 0.0;
  double busy = 0.0;
  int in_flight = 0;
  int peak = 0;
};

} // namespace

PipelineSimulation simulate_schedule(
    const std::vector<RankSchedule>& schedule,
    const PipelineShape& shape,
    const PipelinePassCosts& costs) {
  const size_t S = schedule.size();
  std::vector<RankState> ranks(S);
  std::map<int, double> sent_at, posted_at; // by message tag
  PipelineSimulation result;
  result.passes.resize(S);
  // Each event's time is the latest of the rank's own clock and what it waits for, so the
  // order in which ranks are advanced here does not change the times.
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < S; ++r) {
      RankState& state = ranks[r];
      while (state.next < schedule[r].size()) {
        const PipelineAction& action = schedule[r][state.next];
        const int tag = message_tag(action.message, shape);
        if (action.kind == Kind::kWaitRecv || action.kind == Kind::kWaitSend) {
          const auto& events = action.kind == Kind::kWaitRecv ? sent_at : posted_at;
          auto it = events.find(tag);
          if (it == events.end()) {
            break;
          }
          state.time = std::max(state.time, it->second);
        } else if (action.kind == Kind::kSend) {
          sent_at[tag] = state.time;
        } else if (action.kind == Kind::kPostRecv) {
          posted_at[tag] = state.time;
        } else {
          const double cost = pass_cost(action.kind, costs, shape.virtual_stages);
          result.passes[r].push_back({action, state.time, state.time + cost});
          state.time += cost;
          state.busy += cost;
          state.in_flight += action.kind == Kind::kForward         ? 1
                             : action.kind == Kind::kBackwardInput ? 0
                                                                   : -1;
          state.peak = std::max(state.peak, state.in_flight);
        }
        ++state.next;
        progress = true;
      }
    }
  }
  result.completed = true;
  for (size_t r = 0; r < S; ++r) {
    result.makespan = std::max(result.makespan, ranks[r].time);
    result.busy.push_back(ranks[r].busy);
    result.peak_in_flight.push_back(ranks[r].peak);
    if (ranks[r].next < schedule[r].size()) {
      result.completed = false;
      result.deadlock += fmt::format(
          "rank {} waits at action {} ({}); ",
          r,
          ranks[r].next,
          describe(schedule[r][ranks[r].next]));
    }
  }
  return result;
}

double bubble_fraction_formula(
    PipelineScheduleKind kind, const PipelineShape& shape, const PipelinePassCosts& costs) {
  const double S = shape.num_ranks;
  const double M = shape.num_microbatches;
  const double V = shape.virtual_stages;
  if (kind == PipelineScheduleKind::kZeroBubbleH1) {
    const double work = costs.forward + costs.backward_input + costs.backward_weight;
    const double bubble =
        (S - 1) * std::max(0.0, costs.forward + costs.backward_input - costs.backward_weight);
    return bubble / (M * work + bubble);
  }
  return (S - 1) / (V * M + S - 1);
}

std::string render_timeline(
    const PipelineSimulation& simulation,
    const PipelineShape& shape,
    const PipelinePassCosts& costs) {
  const double unit =
      std::min({costs.forward, costs.backward_input, costs.backward_weight}) / shape.virtual_stages;
  const auto cells = static_cast<size_t>(std::ceil(simulation.makespan / unit - 1e-9));
  auto token = [&](const PipelineAction& action) {
    const char* letter = action.kind == Kind::kForward         ? "F"
                         : action.kind == Kind::kBackward      ? "B"
                         : action.kind == Kind::kBackwardInput ? "I"
                                                               : "W";
    std::string text = fmt::format("{}{}", letter, action.microbatch);
    if (shape.virtual_stages > 1) {
      text += static_cast<char>('a' + shape.local_index_of_stage(action.stage));
    }
    return text;
  };
  size_t width = 2;
  for (const auto& rank : simulation.passes) {
    for (const auto& pass : rank) {
      width = std::max(width, token(pass.action).size());
    }
  }
  std::string text;
  for (size_t r = 0; r < simulation.passes.size(); ++r) {
    std::vector<std::string> row(cells, std::string("."));
    for (const auto& pass : simulation.passes[r]) {
      const auto first = static_cast<size_t>(std::llround(pass.start / unit));
      const auto last = static_cast<size_t>(std::llround(pass.end / unit));
      for (size_t c = first; c < last && c < cells; ++c) {
        row[c] = token(pass.action);
      }
    }
    text += fmt::format("rank {} |", r);
    for (const auto& cell : row) {
      text += fmt::format("{:<{}}", cell, width + 1);
    }
    text += "\n";
  }
  return text;
}

} // namespace largo::parallel
