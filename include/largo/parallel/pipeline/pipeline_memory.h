// What each pipeline rank will hold, before any process group exists: its stages'
// parameters (for model-state accounting, memory_estimate.h) and its peak activation
// memory under a schedule — the activations one micro-batch leaves alive in a stage,
// measured on a sample, times the most stage passes the schedule keeps in flight on that
// rank (pipeline_simulation.h). For `largo estimate`.
//
// The activation figure counts what a stage's forward keeps for its backward (and its
// output); it leaves out a backward's transient buffers, received messages, and zb_h1's
// output gradients held between a micro-batch's I and W passes (docs/pipeline.md measures
// those). Measured with core/memory_tracker.h, so on the CPU only (MemoryTracker::supported).
//
// No collectives.
#pragma once

#include <largo/parallel/pipeline/pipeline_schedule.h>
#include <largo/parallel/pipeline/pipeline_stages.h>

#include <cstdint>
#include <vector>

namespace largo::parallel {

struct PipelineRankMemory {
  int rank = 0;
  std::vector<int> stages;                     // this rank's stages (global indices)
  int64_t parameter_count = 0;                 // elements of its stages' parameters
  int64_t activation_bytes_per_microbatch = 0; // the largest of its stages'
  int peak_stages_in_flight = 0;               // simulated, for the schedule
  int64_t peak_activation_bytes = 0;           // the two above multiplied
};

// `sample`: one micro-batch of model inputs. `boundaries`: the cut (num_stages + 1 block
// indices). Runs every block forward once on the sample (with gradients, then frees them).
// Throws ConfigError for a shape the schedule does not take or boundaries that do not cut
// `blocks` into shape.num_stages() stages.
std::vector<PipelineRankMemory> estimate_pipeline_memory(
    const std::vector<PipelineBlock>& blocks,
    const std::vector<int64_t>& boundaries,
    PipelineScheduleKind kind,
    const PipelineShape& shape,
    const at::Tensor& sample);

} // namespace largo::parallel
