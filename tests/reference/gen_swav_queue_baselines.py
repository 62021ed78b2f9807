#!/usr/bin/env python3
"""Reference run of VISSL's SwAV queue over 7 iterations on one process, transcribed from
vissl/losses/swav_loss.py (SwAVLoss.forward: use_queue, the loss averaged over the
prototype sets, update_emb_queue; SwAVCriterion.initialize_queue) and vissl/hooks/
swav_hooks.py (SwAVUpdateQueueScoresHook.on_forward, NormalizePrototypesHook.on_update).
Writes tests/models/baselines/swav_queue_baselines.json:

    $LARGO_PYTHON tests/reference/gen_swav_queue_baselines.py

The head (gen_swav_head_baselines.py's transcription of swav_head) takes a plain gradient
step (p -= lr * grad) after each loss and its prototypes are normalised, so the queue's
rescoring sees other prototypes every iteration. Recorded: the head's initial parameters,
the queue's initial state (drawn after torch.manual_seed(QUEUE_SEED) as VISSL draws it), the
features of each iteration, each iteration's loss, and the queue's state at the end.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_swav_head_baselines import SwAVPrototypesHead, normalize_prototypes  # noqa: E402
from gen_swav_loss_baselines import swav_loss  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                   "swav_queue_baselines.json")
QUEUE_SEED = 7
LR = 0.5
ITERATIONS = 7
N = 2  # images per iteration on this rank


def initial_queue(o):
    """SwAVCriterion.initialize_queue."""
    torch.manual_seed(QUEUE_SEED)
    crops = len(o["crops_for_assign"])
    scores = [torch.rand(crops, o["queue_length"], k) * 2 - 1 for k in o["num_prototypes"]]
    stdv = 1.0 / math.sqrt(o["embedding_dim"] / 3)
    embeddings = torch.rand(crops, o["queue_length"], o["embedding_dim"]).mul_(
        2 * stdv).add_(-stdv)
    return scores, embeddings


def main():
    o = {"temperature": 0.1, "epsilon": 0.05, "num_iters": 3, "num_crops": 3,
         "crops_for_assign": [0, 1], "use_double_precision": False, "queue_length": 4,
         "start_iter": 2, "embedding_dim": 4, "num_prototypes": [3, 5]}
    torch.manual_seed(0)
    head = SwAVPrototypesHead(dims=[5, 4], use_bn=False, num_clusters=o["num_prototypes"])
    initial = {n: p.detach().reshape(-1).tolist() for n, p in head.named_parameters()}
    features = [torch.randn(o["num_crops"] * N, 5) for _ in range(ITERATIONS)]
    queue_scores, queue_embeddings = initial_queue(o)
    start = {"scores": [s.reshape(-1).tolist() for s in queue_scores],
             "embeddings": queue_embeddings.reshape(-1).tolist()}
    losses = []
    use_queue = False  # SwAVLoss's, as the previous iteration's loss left it
    for t in range(ITERATIONS):
        output = head(features[t])
        if use_queue:  # SwAVUpdateQueueScoresHook.on_forward
            with torch.no_grad():
                for crop in range(len(o["crops_for_assign"])):
                    for j in range(len(o["num_prototypes"])):
                        queue_scores[j][crop] = getattr(head, f"prototypes{j}")(
                            queue_embeddings[crop])
        use_queue = t >= o["start_iter"]
        loss = 0
        for j, scores in enumerate(output[1:]):
            loss += swav_loss(scores, o, queue_scores[j].clone() if use_queue else None, False)
        loss /= len(output) - 1
        if use_queue:  # update_emb_queue
            with torch.no_grad():
                emb = output[0].detach()
                for i, crop_id in enumerate(o["crops_for_assign"]):
                    q = queue_embeddings[i]
                    q[N:] = q[:-N].clone()
                    q[:N] = emb[crop_id * N:(crop_id + 1) * N]
        losses.append(loss.item())
        head.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in head.parameters():
                p -= LR * p.grad
        normalize_prototypes(head)
    case = {"name": "two_sets_three_crops", "options": o, "lr": LR, "queue_seed": QUEUE_SEED,
            "parameters": initial, "features": [f.tolist() for f in features],
            "queue_start": start, "losses": losses,
            "queue_end": {"scores": [s.reshape(-1).tolist() for s in queue_scores],
                          "embeddings": queue_embeddings.reshape(-1).tolist()}}
    with open(OUT, "w") as f:
        json.dump({"generated_by": "tests/reference/gen_swav_queue_baselines.py",
                   "torch": torch.__version__, "cases": [case]}, f, indent=1)
    print(f"wrote {os.path.normpath(OUT)}: losses {losses}")


if __name__ == "__main__":
    main()
