// The loss of a self-supervised pretraining run (LOSS.name swav_loss, simclr_info_nce_loss,
// barlow_twins_loss, moco_loss, dino_loss or deepclusterv2_loss) with what it keeps between
// steps, called by the train step in VISSL's order:
//   start_iteration(t)          before optimizer step t (the run's iteration)
//   before_step(model)          before step t's first forward: where the module holds shards
//                               (FSDP), DINO's teacher (built once) and MoCo's momentum
//                               encoder (this step's forwards) get the whole parameters
//                               (ParallelModel::full_parameters(), a collective there)
//   loss(output, labels)        each micro-step, after the forward (the ParallelModel's
//                               LossFunction; only DeepCluster v2 reads the labels):
//     SimCLR  simclr_info_nce_loss over the rank's [2n, d] embeddings (view-major),
//             L2-normalised first as VISSL's SimclrInfoNCELoss does
//     Barlow Twins  barlow_twins_loss over the rank's [2n, d] embeddings (view-major)
//     MoCo    the MocoModel's [n, 2d] output (query | normalised key): moco_loss of the
//             queries against their keys and the queue, then the keys of every rank enqueued
//     DINO    the DinoModel's [(crops + T) * n, K] output (student rows | teacher rows):
//             dino_loss at the teacher temperature of iteration t, the center updated
//     SwAV    the queue rescored with the current prototypes when it was used by the previous
//             call, swav_loss averaged over the prototype sets (the queue's scores appended
//             from queue.start_iter on), then the assigned crops' embeddings pushed;
//             hard assignments for the first temp_hard_assignment_iters calls
//     DeepCluster v2  deepclusterv2_loss of the rank's [crops * n, d] embeddings against the
//             centroids, the targets the assignments of the labels (LABEL_TYPE
//             sample_index: the images' indexes), then the memory written
//   before_optimizer_step(model) MODEL.TEMP_FROZEN_PARAMS_ITER_MAP: the gradients of the
//                               listed parameters dropped while t < their iteration
//                               (ParallelModel::drop_gradients, in every mode: their
//                               pieces too), so the optimizer leaves them as they are
//                               (VISSL's FreezeParametersHook)
//   after_optimizer_step(model) DINO's teacher moved towards the student at
//                               dino_teacher_momentum(t) (VISSL's DINOHook.on_update), from
//                               the module's own tensors where they are whole, else from the
//                               gathered whole values (FSDP: a collective there);
//                               SwAV's prototypes normalised (normalize_last_layer), through
//                               the ParallelModel: in the module, or under FSDP in the
//                               shards (a collective there)
// DeepCluster v2 adds, before each epoch's first step (VISSL's InitMemoryHook and
// ClusterMemoryHook): while memory_needs_filling(), fill_memory(output, labels) for every batch
// of one pass over the data, then finish_filling_memory(); then start_epoch(epoch).
// The losses are collective over the data-parallel group (Sinkhorn's sums, SimCLR's gather,
// Barlow Twins' batch statistics and cross-correlation, MoCo's gather of the keys), and so is
// start_epoch (DeepCluster v2's k-means, deepclusterv2_memory.h).
#pragma once

#include <largo/comm/process_group.h>
#include <largo/models/barlow_twins_loss.h>
#include <largo/models/deepclusterv2_loss.h>
#include <largo/models/deepclusterv2_memory.h>
#include <largo/models/dino_loss.h>
#include <largo/models/dino_model.h>
#include <largo/models/moco_loss.h>
#include <largo/models/moco_model.h>
#include <largo/models/moco_queue.h>
#include <largo/models/simclr_info_nce_loss.h>
#include <largo/models/swav_head.h>
#include <largo/models/swav_loss.h>
#include <largo/models/swav_queue.h>
#include <largo/parallel/parallelize.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace largo::train {

struct SelfSupervisedLossOptions {
  // LOSS.name: "swav_loss" | "simclr_info_nce_loss" | "barlow_twins_loss" | "moco_loss";
  // empty: not SSL
  std::string name;
  // LOSS.swav_loss: temperature, epsilon, num_iters, crops_for_assign,
  // use_double_precision (num_crops is the data's view count, as VISSL infers it).
  models::SwavLossOptions swav;
  bool normalize_last_layer = true;       // LOSS.swav_loss.normalize_last_layer
  int64_t temp_hard_assignment_iters = 0; // LOSS.swav_loss.temp_hard_assignment_iters
  // LOSS.swav_loss.queue.queue_length: images over all ranks (0: no queue); as VISSL, rounded
  // down to a multiple of the global batch, each rank keeping its share.
  int64_t queue_length = 0;
  int64_t queue_start_iter = 0;        // LOSS.swav_loss.queue.start_iter (counted in loss calls)
  models::SimclrInfoNceOptions simclr; // LOSS.simclr_info_nce_loss.temperature
  // LOSS.simclr_info_nce_loss.buffer_params.embedding_dim: the head's output width (checked).
  int64_t simclr_embedding_dim = 128;
  models::BarlowTwinsLossOptions barlow_twins; // LOSS.barlow_twins_loss.lambda_, scale_loss
  // LOSS.barlow_twins_loss.embedding_dim: the head's output width (checked).
  int64_t barlow_twins_embedding_dim = 8192;
  // MoCo (LOSS.moco_loss): temperature; the queue's size (keys over all ranks, a multiple of
  // the global batch) and the keys' width, which is the head's output width (checked). The
  // momentum and shuffle_batch are the model's (models::ModelOptions::moco).
  models::MocoLossOptions moco;
  int64_t moco_queue_size = 65536;
  int64_t moco_embedding_dim = 128;
  // DINO (LOSS.dino_loss): student_temp, teacher_temp_min / max / warmup_iters, ema_center
  // (center_momentum), crops_for_teacher; num_crops is the data's crop count and output_dim the
  // dino_head's num_clusters, inferred as VISSL does. The teacher's EMA factor at iteration 0
  // (momentum, cosine to 1 over dino_max_iteration: OPTIMIZER.num_epochs x iterations per
  // epoch, which the trainer sets).
  models::DinoLossOptions dino;
  double dino_momentum = 0.996;
  int64_t dino_max_iteration = 1;
  // DeepCluster v2 (LOSS.deepclusterv2_loss): temperature; num_clusters, kmeans_iters and
  // memory_params (crops_for_mb, embedding_dim: the head's output width, checked). The memory's
  // num_crops is the data's crop count (set by SelfSupervisedLoss), num_samples (the dataset's
  // images) and memory_size_per_rank (the images a rank reads per epoch) the trainer's.
  models::DeepClusterV2LossOptions deepclusterv2;
  models::DeepClusterV2MemoryOptions deepclusterv2_memory;
  // MODEL.TEMP_FROZEN_PARAMS_ITER_MAP: parameter name (the module's, e.g.
  // "head.0.prototypes0.weight") -> the iteration from which it trains.
  std::vector<std::pair<std::string, int64_t>> frozen_parameters;

  bool enabled() const {
    return !name.empty();
  }
  bool is_swav() const {
    return name == "swav_loss";
  }
  bool is_barlow_twins() const {
    return name == "barlow_twins_loss";
  }
  bool is_moco() const {
    return name == "moco_loss";
  }
  bool is_dino() const {
    return name == "dino_loss";
  }
  bool is_deepclusterv2() const {
    return name == "deepclusterv2_loss";
  }
  // SimCLR, Barlow Twins and MoCo: two views of one size per image through a projection of
  // mlp heads, whose output width is this key's value.
  bool compares_two_views() const {
    return name == "simclr_info_nce_loss" || is_barlow_twins() || is_moco();
  }
  // Those and DeepCluster v2 train a projection of mlp heads (DeepCluster v2 on any crops).
  bool trains_projection() const {
    return compares_two_views() || is_deepclusterv2();
  }
  int64_t projection_width() const {
    return is_barlow_twins()    ? barlow_twins_embedding_dim
           : is_moco()          ? moco_embedding_dim
           : is_deepclusterv2() ? deepclusterv2_memory.embedding_dim
                                : simclr_embedding_dim;
  }
  std::string projection_width_key() const {
    return is_barlow_twins()    ? "LOSS.barlow_twins_loss.embedding_dim"
           : is_moco()          ? "LOSS.moco_loss.embedding_dim"
           : is_deepclusterv2() ? "LOSS.deepclusterv2_loss.memory_params.embedding_dim"
                                : "LOSS.simclr_info_nce_loss.buffer_params.embedding_dim";
  }
};

// VISSL's queue arithmetic: the queue length per rank (0: no queue).
int64_t local_queue_length(int64_t queue_length, int64_t batch_size, int64_t world_size);

class SelfSupervisedLoss {
 public:
  // `module`: the trained module (its parameters by name for the frozen map; for SwAV its
  // "head.0" is the SwavHead; for MoCo it is a MocoModel, for DINO a DinoModel); `group`: the ranks
  // whose batches make the global batch; `batch_size` the images per rank and micro-step; `seed`
  // draws this rank's initial queue (SwAV's, MoCo's) and, plus the epoch, DeepCluster v2's
  // initial centroids (on the group's rank 0). Throws ConfigError for a frozen name the
  // module does not have, a SwAV run without a swav_head, a MoCo run without a MocoModel or a queue
  // that is not a multiple of the global batch, OptionError for bad loss options.
  SelfSupervisedLoss(
      SelfSupervisedLossOptions options,
      int64_t num_views,
      torch::nn::Module& module,
      comm::ProcessGroup& group,
      int64_t batch_size,
      uint64_t seed);

  void start_iteration(int64_t iteration) {
    iteration_ = iteration;
  }
  void before_step(parallel::ParallelModel& model);
  at::Tensor loss(const at::Tensor& output, const at::Tensor& labels);
  void before_optimizer_step(parallel::ParallelModel& model);
  void after_optimizer_step(parallel::ParallelModel& model);

  // DeepCluster v2 (false for the other losses): the memory needs its initial pass (a fresh
  // start, or a checkpoint without this world's memory); fill_memory writes one batch of it
  // (`output` [crops * n, d], `labels` the images' indexes), finish_filling_memory ends it.
  bool memory_needs_filling() const {
    return memory_.has_value() && !memory_filled_;
  }
  void fill_memory(const at::Tensor& output, const at::Tensor& labels);
  void finish_filling_memory() {
    memory_filled_ = true;
  }
  // Collective for DeepCluster v2 (nothing otherwise): the memory's k-means, unless it ran
  // for this epoch already (a mid-epoch checkpoint holds its result).
  void start_epoch(int64_t epoch);
  const models::DeepClusterV2Memory* deepclusterv2_memory() const {
    return memory_ ? &*memory_ : nullptr;
  }

  // SwAV's queue and its call count, by VISSL's buffer names (empty without a queue); MoCo's
  // queue ("queue", "queue_ptr") and momentum encoder ("moco_encoder.*", "moco_num_forwards");
  // DINO's center ("center") and teacher ("teacher.*", "teacher_built"); DeepCluster v2's
  // memory (DeepClusterV2Memory::state_dict's, "memory_filled", "clustered_epoch"): this rank's,
  // for the checkpoint.
  std::map<std::string, at::Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, at::Tensor>& state);
  // Whether state_dict() is the same on every rank (MoCo's and DINO's: updated from every
  // rank's keys or scores, or from the replicated model), so that a run of another world size
  // can take rank 0's; SwAV's queue and DeepCluster v2's memory hold each rank's own images.
  // (The momentum encoder's BatchNorm statistics are each rank's, from its shuffled keys; its
  // forward in training normalises by the batch and never reads them.)
  bool state_is_same_on_every_rank() const {
    return dino_loss_.has_value() || moco_queue_.has_value();
  }
  // "SwAV (3 crops, 2 assigned, 1 prototype set of 30, queue of 64 per rank from call 5)".
  std::string describe() const;

 private:
  at::Tensor swav(const at::Tensor& output);
  at::Tensor moco(const at::Tensor& output);
  at::Tensor dino(const at::Tensor& output);
  at::Tensor deepclusterv2(const at::Tensor& output, const at::Tensor& labels);
  void build_dino(torch::nn::Module& module, int64_t num_views);
  void build_moco(torch::nn::Module& module, int64_t batch_size, uint64_t seed);
  // model.placements().module_holds_whole_model(), asked once (it builds every parameter's
  // placement) and kept: DINO and MoCo ask each step.
  bool module_holds_whole_model(const parallel::ParallelModel& model);

  SelfSupervisedLossOptions options_;
  comm::ProcessGroup& group_;
  std::optional<bool> module_holds_whole_model_;
  models::SwavHeadImpl* head_ = nullptr; // SwAV
  std::vector<std::string> prototype_names_; // SwAV: the prototypes' weights in the module
  std::optional<models::SwavQueue> queue_;
  models::MocoModelImpl* moco_model_ = nullptr; // MoCo
  std::optional<models::MocoQueue> moco_queue_;
  models::DinoModelImpl* dino_model_ = nullptr; // DINO
  std::optional<models::DinoLoss> dino_loss_;
  std::optional<models::DeepClusterV2Memory> memory_; // DeepCluster v2
  bool memory_filled_ = false;
  int64_t clustered_epoch_ = -1;
  uint64_t seed_ = 0;
  int64_t queue_length_ = 0;                           // images per rank
  // Parameter name, iteration it trains from.
  std::vector<std::pair<std::string, int64_t>> frozen_;
  int64_t iteration_ = 0;
  int64_t calls_ = 0; // VISSL's num_iteration: loss calls (micro-steps) so far
};

} // namespace largo::train
