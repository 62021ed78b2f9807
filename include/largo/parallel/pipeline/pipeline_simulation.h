// Runs pipeline schedules (pipeline_schedule.h) on paper: every rank follows its list, a
// pass takes a fixed time, messages arrive at once. What comes out is what the schedule
// promises before any tensor moves: whether it can deadlock, its bubble (the idle fraction
// of each rank), and how many micro-batches' activations each rank keeps alive at its peak.
// The benchmark (bench/pipeline_bench.cpp) compares these figures with measured ones.
//
// Semantics, as the executor's on Gloo: Send and PostRecv never block; WaitRecv blocks until
// the message was sent; WaitSend blocks until the receiver has posted the receive (a Gloo
// send completes only then). A stage's pass costs cost / V (V stages per rank share the
// rank's part of the model). Activations are counted from a stage's forward to its backward
// (B) or weight pass (W), in stages, so V stages per rank count V per micro-batch.
//
// No collectives; nothing here touches tensors.
#pragma once

#include <largo/parallel/pipeline/pipeline_schedule.h>

#include <string>
#include <vector>

namespace largo::parallel {

// Time of one micro-batch's pass through one rank's whole part of the model.
struct PipelinePassCosts {
  double forward = 1.0;
  double backward_input = 1.0;  // I; a full backward B costs I + W
  double backward_weight = 1.0; // W
};

struct PipelineSimulation {
  struct Pass {
    PipelineAction action;
    double start = 0.0;
    double end = 0.0;
  };
  bool completed = false;
  std::string deadlock;                  // when not completed: where each stuck rank waits
  double makespan = 0.0;                 // when the last rank finishes
  std::vector<double> busy;              // per rank: time spent in passes
  std::vector<int> peak_in_flight;       // per rank: most stages' activations alive at once
  std::vector<std::vector<Pass>> passes; // per rank, the compute actions with their times

  // Per rank 1 - busy / makespan, and their mean.
  std::vector<double> idle_fractions() const;
  double mean_idle_fraction() const;
};

PipelineSimulation simulate_schedule(
    const std::vector<RankSchedule>& schedule,
    const PipelineShape& shape,
    const PipelinePassCosts& costs = {});

// The bubble the schedule's closed form predicts (every rank does the same work):
// gpipe, 1f1b, interleaved_1f1b: (S-1) / (V*M + S-1); with V = 1 this is the usual
// (S-1)/(M+S-1), and for V > 1 about that divided by V.
// zb_h1: (S-1)(F+I-W) / (M(F+I+W) + (S-1)(F+I-W)) when W <= F + I and M >= S (with fewer
// micro-batches than ranks the weight passes have no bubble to fill and it idles more).
double bubble_fraction_formula(
    PipelineScheduleKind kind, const PipelineShape& shape, const PipelinePassCosts& costs = {});

// The simulated timeline as text, one row per rank and one cell per time unit of
// min(pass cost) / V: "F3" forward of micro-batch 3, "B3" backward, "I3"/"W3" its halves,
// ". " idle; with V > 1 a stage letter follows the micro-batch (F3a, F3b: local stage 0, 1).
std::string render_timeline(
    const PipelineSimulation& simulation,
    const PipelineShape& shape,
    const PipelinePassCosts& costs = {});

} // namespace largo::parallel
