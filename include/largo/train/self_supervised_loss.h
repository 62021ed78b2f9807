// The loss of a self-supervised pretraining run (LOSS.name swav_loss, simclr_info_nce_loss,
// barlow_twins_loss or moco_loss) with what it keeps between steps, called by the train step in
// VISSL's order:
//   start_iteration(t)          before optimizer step t (the run's iteration)
//   loss(output, labels)        each micro-step, after the forward (the ParallelModel's
//                               LossFunction; the labels are not used):
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
//   before_optimizer_step(model) MODEL.TEMP_FROZEN_PARAMS_ITER_MAP: the gradients of the
//                               listed parameters dropped while t < their iteration
//                               (ParallelModel::drop_gradients, in every mode: their
//                               pieces too), so the optimizer leaves them as they are
//                               (VISSL's FreezeParametersHook)
//   after_optimizer_step(model) DINO's teacher moved towards the student at
//                               dino_teacher_momentum(t) (VISSL's DINOHook.on_update);
//                               SwAV's prototypes normalised (normalize_last_layer), through
//                               the ParallelModel: in the module, or under FSDP in the
//                               shards (a collective there)
// The losses are collective over the data-parallel group (Sinkhorn's sums, SimCLR's gather,
// Barlow Twins' batch statistics and cross-correlation, MoCo's gather of the keys).
#pragma once

#include <largo/comm/process_group.h>
#include <largo/models/barlow_twins_loss.h>
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
  // SimCLR, Barlow Twins and MoCo: two views of one size per image through a projection of
  // mlp heads, whose output width is this key's value.
  bool compares_two_views() const {
    return name == "simclr_info_nce_loss" || is_barlow_twins() || is_moco();
  }
  int64_t projection_width() const {
    return is_barlow_twins() ? barlow_twins_embedding_dim
           : is_moco()       ? moco_embedding_dim
                             : simclr_embedding_dim;
  }
  std::string projection_width_key() const {
    return is_barlow_twins() ? "LOSS.barlow_twins_loss.embedding_dim"
           : is_moco()       ? "LOSS.moco_loss.embedding_dim"
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
  // draws this rank's initial queue (SwAV's, MoCo's). Throws ConfigError for a frozen name the
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
  at::Tensor loss(const at::Tensor& output, const at::Tensor& labels);
  void before_optimizer_step(parallel::ParallelModel& model);
  void after_optimizer_step(parallel::ParallelModel& model);

  // SwAV's queue and its call count, by VISSL's buffer names (empty without a queue); MoCo's
  // queue ("queue", "queue_ptr") and momentum encoder ("moco_encoder.*", "moco_num_forwards");
  // DINO's center ("center") and teacher ("teacher.*", "teacher_built"): this rank's, for the
  // checkpoint.
  std::map<std::string, at::Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, at::Tensor>& state);
  // "SwAV (3 crops, 2 assigned, 1 prototype set of 30, queue of 64 per rank from call 5)".
  std::string describe() const;

 private:
  at::Tensor swav(const at::Tensor& output);
  at::Tensor moco(const at::Tensor& output);
  at::Tensor dino(const at::Tensor& output);
  void build_dino(torch::nn::Module& module, int64_t num_views);
  void build_moco(torch::nn::Module& module, int64_t batch_size, uint64_t seed);

  SelfSupervisedLossOptions options_;
  comm::ProcessGroup& group_;
  models::SwavHeadImpl* head_ = nullptr; // SwAV
  std::vector<std::string> prototype_names_; // SwAV: the prototypes' weights in the module
  std::optional<models::SwavQueue> queue_;
  models::MocoModelImpl* moco_model_ = nullptr; // MoCo
  std::optional<models::MocoQueue> moco_queue_;
  models::DinoModelImpl* dino_model_ = nullptr; // DINO
  std::optional<models::DinoLoss> dino_loss_;
  int64_t queue_length_ = 0;                           // images per rank
  // Parameter name, iteration it trains from.
  std::vector<std::pair<std::string, int64_t>> frozen_;
  int64_t iteration_ = 0;
  int64_t calls_ = 0; // VISSL's num_iteration: loss calls (micro-steps) so far
};

} // namespace largo::train
