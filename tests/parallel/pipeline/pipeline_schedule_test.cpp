// Pipeline schedules as arithmetic: every list is valid (each micro-batch forward before its
// backward, every send paired with a receive in channel order, waits where they cannot
// block), runs to the end in simulation, has the bubble of its closed form and keeps the
// activations the schedule promises alive.
#include <largo/core/error.h>
#include <largo/parallel/pipeline/pipeline_schedule.h>
#include <largo/parallel/pipeline/pipeline_simulation.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

namespace largo::parallel::pipeline_schedule_test {
namespace {

using Kind = PipelineAction::Kind;
using Schedule = PipelineScheduleKind;

struct Case {
  Schedule kind;
  int ranks;
  int microbatches;
  int virtual_stages;
};

std::string name_of(const Case& c) {
  return fmt::format(
      "{}_S{}_M{}_V{}", to_string(c.kind), c.ranks, c.microbatches, c.virtual_stages);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int S : {1, 2, 3, 4}) {
    for (int M : {1, 2, 3, 4, 8, 16}) {
      cases.push_back({Schedule::kGPipe, S, M, 1});
      cases.push_back({Schedule::kOneFOneB, S, M, 1});
      cases.push_back({Schedule::kZeroBubbleH1, S, M, 1});
      for (int V : {2, 3}) {
        if (S >= 2 && M % S == 0) {
          cases.push_back({Schedule::kInterleaved1F1B, S, M, V});
        }
      }
    }
  }
  return cases;
}

PipelineShape shape_of(const Case& c) {
  return {c.ranks, c.microbatches, c.virtual_stages};
}

// The cases run in loops inside a few tests (not one test each): each test is a process
// under ctest, and 350 of them would cost more than their arithmetic.
TEST(ScheduleTest, EveryScheduleIsValidAndRunsToTheEnd) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name_of(c));
    const auto schedule = pipeline_schedule(c.kind, shape_of(c));
    EXPECT_NO_THROW(validate_schedule(schedule, shape_of(c)));
    const auto simulation = simulate_schedule(schedule, shape_of(c));
    EXPECT_TRUE(simulation.completed) << simulation.deadlock;
  }
}

// Unequal pass costs too: the closed forms hold for any F, I, W (zb_h1: W <= F + I, and at
// least as many micro-batches as ranks, or there is no steady phase whose W could fill).
TEST(ScheduleTest, BubbleEqualsTheClosedForm) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name_of(c));
    if (c.kind == Schedule::kZeroBubbleH1 && c.microbatches < c.ranks) {
      continue; // zb_h1's closed form needs M >= S
    }
    const auto schedule = pipeline_schedule(c.kind, shape_of(c));
    for (const PipelinePassCosts costs :
         {PipelinePassCosts{1, 1, 1}, PipelinePassCosts{1, 1.5, 0.5}, PipelinePassCosts{2, 1, 1}}) {
      const auto simulation = simulate_schedule(schedule, shape_of(c), costs);
      // Every rank does the same work, so every rank idles the same fraction.
      const double expected = bubble_fraction_formula(c.kind, shape_of(c), costs);
      for (double idle : simulation.idle_fractions()) {
        EXPECT_NEAR(idle, expected, 1e-12) << render_timeline(simulation, shape_of(c), costs);
      }
    }
  }
}

// Activations alive per rank, in stages (V per micro-batch for interleaving):
// gpipe M; 1f1b S - r (PipeDream-Flush's bound); zb_h1 S (r deferred weight passes on top
// of 1f1b's S - r); interleaved Megatron's warm-up + 1. Each capped by what exists.
TEST(ScheduleTest, PeakActivationsInFlight) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name_of(c));
    const auto simulation = simulate_schedule(pipeline_schedule(c.kind, shape_of(c)), shape_of(c));
    for (int r = 0; r < c.ranks; ++r) {
      int expected = 0;
      switch (c.kind) {
      case Schedule::kGPipe:
        expected = c.microbatches;
        break;
      case Schedule::kOneFOneB:
        expected = std::min(c.ranks - r, c.microbatches);
        break;
      case Schedule::kZeroBubbleH1:
        expected = std::min(c.ranks, c.microbatches);
        break;
      case Schedule::kInterleaved1F1B:
        expected = c.microbatches == c.ranks
                       ? c.microbatches * c.virtual_stages
                       : (c.ranks - r - 1) * 2 + (c.virtual_stages - 1) * c.ranks + 1;
        break;
      }
      EXPECT_EQ(simulation.peak_in_flight[r], expected) << "rank " << r;
    }
  }
}

// A send's buffer is released while the step goes on, not all at the end: at no point does
// a rank hold more unwaited sends than stages' activations in flight plus one.
TEST(ScheduleTest, SendsAreWaitedForEarly) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(name_of(c));
    const auto schedule = pipeline_schedule(c.kind, shape_of(c));
    const auto simulation = simulate_schedule(schedule, shape_of(c));
    for (size_t r = 0; r < schedule.size(); ++r) {
      int outstanding = 0, most = 0;
      for (const auto& action : schedule[r]) {
        outstanding += action.kind == Kind::kSend ? 1 : action.kind == Kind::kWaitSend ? -1 : 0;
        most = std::max(most, outstanding);
      }
      EXPECT_EQ(outstanding, 0);
      EXPECT_LE(most, simulation.peak_in_flight[r] + 1) << "rank " << r;
    }
  }
}

TEST(ScheduleShapeTest, ShapesASheduleCannotTakeAreConfigErrors) {
  EXPECT_THROW(compute_schedule(Schedule::kOneFOneB, {2, 0, 1}), ConfigError);
  EXPECT_THROW(compute_schedule(Schedule::kGPipe, {2, 4, 2}), ConfigError);
  EXPECT_THROW(compute_schedule(Schedule::kInterleaved1F1B, {2, 3, 2}), ConfigError);
  EXPECT_THROW(compute_schedule(Schedule::kInterleaved1F1B, {1, 4, 2}), ConfigError);
  EXPECT_THROW(compute_schedule(Schedule::kInterleaved1F1B, {2, 4, 1}), ConfigError);
  EXPECT_EQ(parse_pipeline_schedule("zb_h1"), Schedule::kZeroBubbleH1);
  EXPECT_EQ(to_string(parse_pipeline_schedule("interleaved_1f1b")), "interleaved_1f1b");
  EXPECT_THROW(parse_pipeline_schedule("1F1B"), ConfigError);
}

// The validator is not a rubber stamp: each broken rule is caught.
TEST(ScheduleValidationTest, BrokenListsAreRejected) {
  const PipelineShape shape{2, 4, 1};
  const auto good = pipeline_schedule(Schedule::kOneFOneB, shape);
  ASSERT_NO_THROW(validate_schedule(good, shape));
  auto find = [](RankSchedule& list, Kind kind) {
    return std::find_if(list.begin(), list.end(), [&](const auto& a) { return a.kind == kind; });
  };
  {
    auto bad = good; // rank 1 loses the wait for its first activation
    bad[1].erase(find(bad[1], Kind::kWaitRecv));
    EXPECT_THROW(validate_schedule(bad, shape), Error);
  }
  {
    auto bad = good; // rank 0 never sends one activation
    bad[0].erase(find(bad[0], Kind::kSend));
    EXPECT_THROW(validate_schedule(bad, shape), Error);
  }
  {
    auto bad = good; // a backward before its forward
    auto forward = find(bad[1], Kind::kForward);
    auto backward = find(bad[1], Kind::kBackward);
    std::iter_swap(forward, backward);
    EXPECT_THROW(validate_schedule(bad, shape), Error);
  }
  {
    auto bad = good; // rank 0 sends its first two activations in the other order
    std::vector<size_t> sends;
    for (size_t i = 0; i < bad[0].size(); ++i) {
      if (bad[0][i].kind == Kind::kSend) {
        sends.push_back(i);
      }
    }
    std::swap(bad[0][sends[0]].message, bad[0][sends[1]].message);
    std::swap(bad[0][sends[0]].microbatch, bad[0][sends[1]].microbatch);
    EXPECT_THROW(validate_schedule(bad, shape), Error);
  }
  {
    auto bad = good; // a stage on the wrong rank
    bad[0].front().stage = 1;
    EXPECT_THROW(validate_schedule(bad, shape), Error);
  }
}

// A schedule whose two ranks each wait for the other first cannot finish; the simulation
// says where each waits, and add_communication refuses to place its sends' waits.
TEST(ScheduleSimulationTest, CrossedWaitsAreADeadlock) {
  const PipelineShape shape{2, 1, 1};
  auto compute = compute_schedule(Schedule::kGPipe, shape);
  // Rank 0 runs its backward before its forward could have sent anything: it waits for a
  // gradient that rank 1 can only produce after rank 0's activation.
  std::swap(compute[0][0], compute[0][1]);
  EXPECT_THROW(add_communication(compute, shape), Error);
}

// The timelines in docs/pipeline.md come from render_timeline; this pins its format.
TEST(ScheduleSimulationTest, TimelineOfGPipeOnTwoRanks) {
  const PipelineShape shape{2, 2, 1};
  const auto simulation = simulate_schedule(pipeline_schedule(Schedule::kGPipe, shape), shape);
  EXPECT_EQ(
      render_timeline(simulation, shape),
      "rank 0 |F0 F1 .  .  .  B0 B0 B1 B1 \n"
      "rank 1 |.  F0 F1 B0 B0 B1 B1 .  .  \n");
  EXPECT_DOUBLE_EQ(simulation.makespan, 9.0);
  EXPECT_DOUBLE_EQ(simulation.mean_idle_fraction(), 1.0 / 3.0); // (S-1)/(M+S-1)
}

} // namespace
} // namespace largo::parallel::pipeline_schedule_test
