// The 2-D layout of ranks for pipeline x data parallelism: P pipeline ranks (stages) times
// D data-parallel replicas, world = P * D.
//
// Layout: world rank = stage * D + replica. A stage's D replicas hold consecutive ranks
// (usually one machine), because their traffic — a gradient all-reduce of the whole stage
// every step — is the heavier one; a pipeline's P stages are D ranks apart, and exchange only
// activations and their gradients (one micro-batch at a stage boundary at a time). With
// D = 1 the world is one pipeline; with P = 1, plain data parallelism.
//
// The data each rank loads follows the replica, not the world rank: every stage of one
// pipeline must see the same batch (a sampler with num_replicas = D, rank = replica).
//
// Collectives: make_pipeline_mesh (new_group over the world for every pipeline and every
// data-parallel group, in the same order on every rank).
#pragma once

#include <largo/comm/process_group.h>

#include <memory>
#include <string>

namespace largo::parallel {

struct PipelineMesh {
  std::shared_ptr<comm::ProcessGroup> pipeline;      // this rank's pipeline: rank = stage
  std::shared_ptr<comm::ProcessGroup> data_parallel; // this stage's replicas: rank = replica
  int pipeline_size = 1;                             // P (DISTRIBUTED.PIPELINE_SIZE)
  int data_parallel_size = 1;                        // D = world / P
  int stage = 0;                                     // this rank's pipeline rank
  int replica = 0;                                   // this rank's data-parallel rank

  // "world 4 = pipeline 2 x data parallel 2 (world rank = stage * 2 + replica); this rank 3:
  // stage 1, replica 1"
  std::string describe() const;
};

// The replica (data-parallel rank) of world rank `world_rank`, and the number of replicas,
// under the layout above; known before any group exists (to build the data loaders).
int replica_of(int world_rank, int world_size, int pipeline_size);
int num_replicas(int world_size, int pipeline_size);

// Splits `world` into pipelines of `pipeline_size` ranks. Throws ConfigError (naming
// DISTRIBUTED.PIPELINE_SIZE) unless pipeline_size >= 1 divides the world size. Collective.
PipelineMesh make_pipeline_mesh(comm::ProcessGroup& world, int pipeline_size);

} // namespace largo::parallel
