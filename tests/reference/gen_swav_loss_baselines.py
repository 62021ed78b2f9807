#!/usr/bin/env python3
"""Reference values of VISSL's swav_loss for one prototype head on one process, transcribed
from vissl/losses/swav_loss.py (SwAVCriterion.forward) and
vissl/losses/distibuted_sinkhornknopp.py (distributed_sinkhornknopp) with a world of one (its
all-reduces are identities). Writes tests/models/baselines/swav_loss_baselines.json:

    $LARGO_PYTHON tests/reference/gen_swav_loss_baselines.py

Each case: the options, the [num_crops * n, K] scores (crop-major), the queue's scores if
any, the loss and its gradient with respect to the scores.
"""
import json
import os

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                   "swav_loss_baselines.json")


def sinkhorn(Q, num_iter, hard_assignment, use_double_prec):
    """distributed_sinkhornknopp with world_size 1."""
    eps_num_stab = 1e-12
    with torch.no_grad():
        mask = torch.isinf(Q)
        ind = torch.nonzero(mask)
        if len(ind) > 0:
            for i in ind:
                Q[i[0], i[1]] = 0
            m = torch.max(Q)
            for i in ind:
                Q[i[0], i[1]] = m
        sum_Q = torch.sum(Q, dtype=Q.dtype)
        Q /= sum_Q
        k, n = Q.shape
        N = Q.shape[1]
        r = torch.ones(k) / k
        c = torch.ones(n) / N
        if use_double_prec:
            r, c = r.double(), c.double()
        for _ in range(num_iter):
            u = torch.sum(Q, dim=1, dtype=Q.dtype)
            if len(torch.nonzero(u == 0)) > 0:
                Q += eps_num_stab
                u = torch.sum(Q, dim=1, dtype=Q.dtype)
            u = r / u
            mask = torch.isinf(u)
            ind = torch.nonzero(mask)
            if len(ind) > 0:
                for i in ind:
                    u[i[0]] = 0
                m = torch.max(u)
                for i in ind:
                    u[i[0]] = m
            Q *= u.unsqueeze(1)
            Q *= (c / torch.sum(Q, dim=0, dtype=Q.dtype)).unsqueeze(0)
        Q = (Q / torch.sum(Q, dim=0, keepdim=True, dtype=Q.dtype)).t().float()
        if hard_assignment:
            index_max = torch.max(Q, dim=1)[1]
            Q.zero_()
            Q.scatter_(1, index_max.unsqueeze(1), 1)
        return Q


def swav_loss(scores, o, queue, hard_assignment):
    """SwAVCriterion.forward for one head."""
    bs = scores.shape[0] // o["num_crops"]
    total_loss = 0
    n_term_loss = 0
    log_softmax = torch.nn.LogSoftmax(dim=1)
    for i, crop_id in enumerate(o["crops_for_assign"]):
        with torch.no_grad():
            scores_this_crop = scores[bs * crop_id: bs * (crop_id + 1)]
            if queue is not None:
                scores_this_crop = torch.cat((scores_this_crop, queue[i]))
            if o["use_double_precision"]:
                assignments = torch.exp(scores_this_crop.double() / o["epsilon"]).t().double()
            else:
                assignments = scores_this_crop / o["epsilon"]
                assignments -= torch.max(assignments)
                assignments = torch.exp(assignments).t()
            assignments = sinkhorn(assignments, o["num_iters"], hard_assignment,
                                   o["use_double_precision"])[:bs]
        loss = 0
        predicting = [p for p in range(o["num_crops"]) if p != crop_id]
        for p in predicting:
            crop = scores[bs * p: bs * (p + 1)]
            if o["use_double_precision"]:
                crop = crop.double()
            loss -= torch.mean(torch.sum(assignments * log_softmax(crop / o["temperature"]),
                                         dim=1, dtype=assignments.dtype))
        loss /= len(predicting)
        total_loss += loss
        n_term_loss += 1
    return total_loss / n_term_loss


def case(name, options, images, prototypes, queue_length, hard_assignment, seed):
    generator = torch.Generator().manual_seed(seed)
    dim = 6
    embeddings = torch.nn.functional.normalize(
        torch.randn(options["num_crops"] * images, dim, generator=generator), dim=1)
    weights = torch.nn.functional.normalize(
        torch.randn(prototypes, dim, generator=generator), dim=1)
    scores = (embeddings @ weights.t()).clone().requires_grad_()
    queue = None
    if queue_length:
        queue = [torch.nn.functional.normalize(
            torch.randn(queue_length, dim, generator=generator), dim=1) @ weights.t()
            for _ in options["crops_for_assign"]]
    loss = swav_loss(scores, options, queue, hard_assignment)
    loss.backward()
    return {"name": name, "options": options, "hard_assignment": hard_assignment,
            "scores": scores.detach().tolist(),
            "queue_scores": [q.tolist() for q in queue] if queue else [],
            "loss": loss.item(), "gradient": scores.grad.tolist()}


def options(num_crops=2, crops_for_assign=(0, 1), double=False):
    return {"temperature": 0.1, "epsilon": 0.05, "num_iters": 3, "num_crops": num_crops,
            "crops_for_assign": list(crops_for_assign), "use_double_precision": double}


def main():
    cases = [
        case("two_crops", options(), images=8, prototypes=5, queue_length=0,
             hard_assignment=False, seed=3),
        case("four_crops_double_with_queue", options(4, (0, 1), True), images=4, prototypes=7,
             queue_length=6, hard_assignment=False, seed=4),
        case("three_crops_hard", options(3, (1,)), images=6, prototypes=4, queue_length=0,
             hard_assignment=True, seed=5),
    ]
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/reference/gen_swav_loss_baselines.py",
                   "torch_version": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
