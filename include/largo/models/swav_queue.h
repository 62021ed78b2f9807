// SwAV's queue (VISSL's LOSS.swav_loss.queue): each rank keeps the embeddings of the assigned
// crops (crops_for_assign) of its last `length` images and their scores against every
// prototype set; the scores are appended to the batch's before Sinkhorn (swav_loss's
// queue_scores), so a small batch still spreads its images over the K clusters.
//
// VISSL's order within iteration t (its loss counts iterations from 0), reproduced when a
// loop calls, after the head's forward:
//   if (queue.in_use(t - 1)) queue.rescore(*head);     // SwAVUpdateQueueScoresHook
//   loss = mean over sets j of swav_loss(out[1 + j], ..., in_use(t) ? queue.scores(j) : {})
//   if (queue.in_use(t)) queue.push(out[0]);           // update_emb_queue
// At t == start_iter the scores used are those the queue started with (VISSL's quirk: its
// hook has not rescored yet). No collectives: each rank keeps its own queue.
#pragma once

#include <largo/models/swav_head.h>

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace largo::models {

struct SwavQueueOptions {
  int64_t length = 0;          // VISSL's local_queue_length: images kept per assigned crop, > 0
  int64_t start_iter = 0;      // the first iteration whose loss uses the queue (queue.start_iter)
  int64_t embedding_dim = 128; // the head's embedding width
  std::vector<int64_t> num_prototypes{3000}; // each prototype set's cluster count
  int64_t num_crops = 2;                     // crops per image in the head's outputs
  std::vector<int64_t> crops_for_assign{0, 1};
};

class SwavQueue {
 public:
  // Starts as VISSL's initialize_queue, drawing from `generator` in its order: each set's
  // scores uniform in [-1, 1), then the embeddings uniform in [-stdv, stdv),
  // stdv = 1 / sqrt(embedding_dim / 3). The queue lives on `device` (the head's): the values
  // are drawn where the generator is (a CPU generator gives the same queue on every device)
  // and moved there. Throws OptionError for options out of range.
  SwavQueue(SwavQueueOptions options, at::Generator generator, c10::Device device = c10::kCPU);

  // Whether iteration `iteration`'s loss uses the queue (and pushes into it).
  bool in_use(int64_t iteration) const {
    return iteration >= options_.start_iter;
  }
  // The stored embeddings scored by each prototype set of `head`, without gradient.
  void rescore(SwavHeadImpl& head);
  // Set j's scores, one [length, num_prototypes[j]] tensor per assigned crop.
  std::vector<at::Tensor> scores(size_t set) const;
  // `embeddings` [num_crops * n, embedding_dim], crop-major: each assigned crop's n rows go to
  // the front of its queue, the oldest n fall off (n <= length).
  void push(const at::Tensor& embeddings);

  // VISSL's buffer names: "local_queue<j>" [crops, length, K_j] and "local_emb_queue"
  // [crops, length, embedding_dim], on the CPU whatever the queue's device (a checkpoint
  // written on a GPU resumes on any machine); a resume loads them back (CheckpointError on a
  // mismatch).
  std::map<std::string, at::Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

 private:
  SwavQueueOptions options_;
  std::vector<at::Tensor> scores_; // per set: [crops, length, K_j]
  at::Tensor embeddings_;          // [crops, length, embedding_dim]
};

} // namespace largo::models
