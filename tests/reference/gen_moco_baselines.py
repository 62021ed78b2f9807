#!/usr/bin/env python3
"""Reference values of VISSL's MoCo (vissl/losses/moco_loss.py and vissl/hooks/moco_hooks.py),
transcribed from its formulas. Writes tests/models/baselines/moco_baselines.json:

    $LARGO_PYTHON tests/reference/gen_moco_baselines.py

Cases:
  loss_*       float64 queries, normalised keys and a normalised queue: MoCoLoss.forward's
               value and its gradient with respect to the (un-normalised) queries.
  initial_queue  torch.randn(d, K) from a seeded generator, normalised along dim 0 (MoCoLoss's
               buffer when each rank seeds its generator).
  train_*      a few SGD steps of a tiny trunk (Flatten, Linear, BatchNorm1d, ReLU) and head
               (Linear), float32, with VISSL's order per step: MoCoHook.on_forward (the momentum
               encoder copied on the first forward, p_k * m + p_q * (1 - m) on the later ones;
               the key from view 1, batch-shuffled across the ranks when there are several),
               the query from view 0, MoCoLoss (logits against the positive key and the queue,
               cross-entropy with class 0, then dequeue/enqueue of the keys gathered in rank
               order), backward, gradients averaged over the ranks (DDP), SGD step. Each rank's
               BatchNorm sees only its own rows (no SyncBatchNorm), as under DDP.
"""
import json
import os

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "baselines",
                   "moco_baselines.json")


def moco_loss(query, key, queue, temperature):
    """MoCoLoss.forward without the enqueue."""
    query = F.normalize(query, dim=1)
    l_pos = torch.einsum("nc,nc->n", [query, key]).unsqueeze(-1)
    l_neg = torch.einsum("nc,ck->nk", [query, queue.clone().detach()])
    logits = torch.cat([l_pos, l_neg], dim=1) / temperature
    labels = torch.zeros(logits.shape[0], dtype=torch.long)
    return F.cross_entropy(logits, labels)


def loss_case(name, n, d, k, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    query = (torch.randn(n, d, generator=g, dtype=torch.float64) * 3).requires_grad_()
    key = F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    queue = F.normalize(torch.randn(d, k, generator=g, dtype=torch.float64), dim=0)
    loss = moco_loss(query, key, queue, temperature)
    loss.backward()
    return {"name": name, "temperature": temperature, "query": query.detach().tolist(),
            "key": key.tolist(), "queue": queue.tolist(), "loss": loss.item(),
            "query_gradient": query.grad.tolist()}


def initial_queue_case(d, k, seed):
    queue = torch.randn(d, k, generator=torch.Generator().manual_seed(seed))
    return {"name": "initial_queue", "embedding_dim": d, "size": k, "seed": seed,
            "queue": F.normalize(queue, dim=0).tolist()}


def tiny_model():
    return torch.nn.ModuleDict({
        "trunk": torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 6),
                                     torch.nn.BatchNorm1d(6), torch.nn.ReLU()),
        "head": torch.nn.Sequential(torch.nn.Linear(6, 4))})


def run(model, x):
    return model["head"](model["trunk"](x))


def train_case(name, world_size, steps, n_per_rank, queue_size, momentum, temperature, lr,
               shuffle_seed, seed):
    torch.manual_seed(seed)
    query_model = tiny_model()
    momentum_model = tiny_model()  # VISSL builds it anew; its values are copied on forward 0
    initial = {k: v.detach().clone() for k, v in query_model.state_dict().items()}
    g = torch.Generator().manual_seed(seed + 1)
    queue = F.normalize(torch.randn(4, queue_size, generator=g), dim=0)
    initial_queue = queue.clone()
    queue_ptr = 0
    optimizer = torch.optim.SGD(query_model.parameters(), lr=lr)
    total = world_size * n_per_rank
    batches, losses = [], []
    for step in range(steps):
        view0 = torch.randn(total, 2, 2, 2, generator=g)
        view1 = torch.randn(total, 2, 2, 2, generator=g)
        batches.append({"view0": view0.reshape(total, -1).tolist(),
                        "view1": view1.reshape(total, -1).tolist()})
        with torch.no_grad():  # MoCoHook.on_forward
            if step == 0:
                for q, k in zip(query_model.parameters(), momentum_model.parameters()):
                    k.data.copy_(q.data)
            else:
                for q, k in zip(query_model.parameters(), momentum_model.parameters()):
                    k.data = k.data * momentum + q.data * (1.0 - momentum)
            if world_size > 1:  # _batch_shuffle_ddp / _batch_unshuffle_ddp
                shuffle = torch.randperm(
                    total, generator=torch.Generator().manual_seed(shuffle_seed + step))
                unshuffle = torch.argsort(shuffle)
                shuffled = [F.normalize(run(momentum_model, view1[idx]), dim=1)
                            for idx in shuffle.view(world_size, -1)]
                gathered = torch.cat(shuffled)
                keys = [gathered[idx] for idx in unshuffle.view(world_size, -1)]
            else:
                keys = [F.normalize(run(momentum_model, view1), dim=1)]
        optimizer.zero_grad()
        rank_losses = []
        for r in range(world_size):
            rows = slice(r * n_per_rank, (r + 1) * n_per_rank)
            query = run(query_model, view0[rows])
            loss = moco_loss(query, keys[r], queue, temperature)
            (loss / world_size).backward()  # DDP: the ranks' gradients averaged
            rank_losses.append(loss.item())
        losses.append(rank_losses)
        with torch.no_grad():  # _dequeue_and_enqueue with concat_all_gather's keys
            gathered_keys = torch.cat(keys)
            queue[:, queue_ptr:queue_ptr + total] = gathered_keys.T
            queue_ptr = (queue_ptr + total) % queue_size
        optimizer.step()
    return {"name": name, "world_size": world_size, "n_per_rank": n_per_rank,
            "queue_size": queue_size, "momentum": momentum, "temperature": temperature,
            "lr": lr, "shuffle_seed": shuffle_seed,
            "initial": {k: v.tolist() for k, v in initial.items()},
            "initial_queue": initial_queue.tolist(), "batches": batches,
            "losses": losses,
            "final": {k: v.detach().tolist() for k, v in query_model.named_parameters()},
            "final_momentum": {k: v.detach().tolist()
                               for k, v in momentum_model.named_parameters()},
            "final_queue": queue.tolist(), "final_queue_ptr": queue_ptr}


def main():
    cases = [
        loss_case("loss_t0_2", n=5, d=4, k=12, temperature=0.2, seed=1),
        loss_case("loss_t0_07", n=3, d=6, k=8, temperature=0.07, seed=2),
        initial_queue_case(d=4, k=16, seed=7),
        train_case("train_one_rank", world_size=1, steps=4, n_per_rank=4, queue_size=8,
                   momentum=0.9, temperature=0.2, lr=0.5, shuffle_seed=11, seed=3),
        train_case("train_two_ranks_shuffled", world_size=2, steps=4, n_per_rank=2,
                   queue_size=8, momentum=0.9, temperature=0.2, lr=0.5, shuffle_seed=11,
                   seed=3),
    ]
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/reference/gen_moco_baselines.py",
                   "torch_version": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
